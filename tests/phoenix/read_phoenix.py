"""Read Phoenix projects' spans and sessions through Phoenix's own client (arize-phoenix-client 3.5.0),
for the Phoenix tier. Runs in .venv-phoenix, which the test venv cannot share (docs/otel.md §4), as one
process for the whole tier: importing the client imports all of Phoenix (about 10 s of CPU), so it is
paid once. Each line on stdin, `PROJECT SPANS`, gets one line of JSON on stdout,
`{"spans": [...], "sessions": [...], "session_io": {SESSION: {"first_input", "last_output"}}}`, once
the project holds at least SPANS spans (Phoenix inserts them asynchronously) or WAIT_S has passed.
`session_io` is what Phoenix's Sessions tab shows of each session, read from its GraphQL API (the
client has no call for it).

    .venv-phoenix/bin/python tests/phoenix/read_phoenix.py http://127.0.0.1:6006
"""

import json
import sys
import time
import urllib.request

from phoenix.client import Client

# Spans showed up about 0.1 s after they were sent (docs/otel.md §4); a loaded machine is much slower.
WAIT_S = 60.0
POLL_S = 0.2


def read(client: Client, client_url: str, project: str, expected: int) -> dict:
    deadline = time.monotonic() + WAIT_S
    spans: list = []
    while len(spans) < expected and time.monotonic() < deadline:
        time.sleep(POLL_S)
        if project in [p["name"] for p in client.projects.list()]:  # the first span creates it
            spans = client.spans.get_spans(project_identifier=project, limit=1000)
    sessions = client.sessions.list(project_name=project) if spans else []
    return {
        "spans": spans,
        "sessions": sessions,
        "session_io": session_io(client_url, project) if spans else {},
    }


# What the Sessions tab shows of each session: its first trace's input and its last trace's output.
SESSION_IO = """query ($name: String!) { getProjectByName(name: $name) {
  sessions(first: 1000) { edges { node {
    sessionId firstInput { value mimeType } lastOutput { value mimeType } } } } } }"""


def session_io(url: str, project: str) -> dict:
    request = urllib.request.Request(
        url.rstrip("/") + "/graphql",
        data=json.dumps({"query": SESSION_IO, "variables": {"name": project}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
        doc = json.load(answer)
    assert "errors" not in doc, doc
    edges = doc["data"]["getProjectByName"]["sessions"]["edges"]
    return {
        edge["node"]["sessionId"]: {
            "first_input": (edge["node"]["firstInput"] or {}).get("value"),
            "last_output": (edge["node"]["lastOutput"] or {}).get("value"),
        }
        for edge in edges
    }


def main(url: str) -> None:
    client = Client(base_url=url)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        project, expected = line.split()
        print(json.dumps(read(client, url, project, int(expected)), default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
