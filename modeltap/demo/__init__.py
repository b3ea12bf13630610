"""`modeltap demo`: a scripted model for people who have none (model.py), and the demo conversation
played through modeltap in front of it (play.py)."""
