"""The record store the proxy writes, and everything that reads it for a person debugging an agent."""
