"""An agent in a separate Python process that speaks only HTTP (`requests`): two chat calls on its
trajectory's URL, the second extending the first. Prints the replies as JSON.

    python requests_agent.py <base_url> <api_key> <question>
"""

import json
import sys

import requests


def chat(base_url: str, api_key: str, messages: list) -> dict:
    response = requests.post(
        f"{base_url}/chat/completions",
        headers={"Authorization": f"Bearer {api_key}"},
        json={"model": "forge_nb-policy", "messages": messages, "max_tokens": 12},
        timeout=600,
    )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]


def main(base_url: str, api_key: str, question: str) -> None:
    messages = [{"role": "user", "content": question}]
    first = chat(base_url, api_key, messages)
    messages += [first, {"role": "user", "content": "Say only the number."}]
    second = chat(base_url, api_key, messages)
    print(json.dumps([first["content"], second["content"]]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
