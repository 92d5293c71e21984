"""What the worker processes of the kill tests share: a JSON POST to Fenceline's API with the
worker token from the environment (FENCELINE_URL, FENCELINE_TOKEN)."""

import json
import os
from collections.abc import Callable

import requests


def poster() -> Callable[[str, dict], dict]:
    base = os.environ["FENCELINE_URL"].rstrip("/") + "/api/v1"
    session = requests.Session()
    session.headers.update(
        {"Authorization": f"Bearer {os.environ['FENCELINE_TOKEN']}", "Content-Type": "application/json"}
    )

    def post(path: str, body: dict) -> dict:
        response = session.post(base + path, data=json.dumps(body), timeout=10)
        response.raise_for_status()
        return response.json()

    return post
