"""The exporters: a recorded session in the formats other tools read (`modeltap export`: export.py),
one module per format (har, jsonl, messages, tokens), and OpenTelemetry spans (otlp.py, genai.py),
which serve also sends live as an observer."""
