"""Drive a running Sluice (`make run`) with third-party OpenAI clients.

Not part of the test suite (these clients are heavy and not dependencies);
run it from a separate venv that has them:

    python -m venv /tmp/clients && /tmp/clients/bin/pip install litellm langchain-openai
    /tmp/clients/bin/python scripts/check_third_party_clients.py [--url http://127.0.0.1:8000/v1]

Each check asks for a fixed number of tokens (ignore_eos) and prints what
the client reports, so the counts can be compared with what the server
produced. guidellm and inference-perf are load tools with their own CLIs;
see the issue notes for the commands used.
"""

import argparse


def check_litellm(url: str, key: str) -> None:
    import litellm

    response = litellm.completion(
        model="openai/tiny-llama", api_base=url, api_key=key, max_tokens=8,
        messages=[{"role": "user", "content": "hello"}], extra_body={"ignore_eos": True},
    )
    print("litellm completion:", response.usage.completion_tokens, "tokens,", repr(response.choices[0].message.content))
    chunks = litellm.completion(
        model="openai/tiny-llama", api_base=url, api_key=key, max_tokens=8, stream=True,
        stream_options={"include_usage": True}, messages=[{"role": "user", "content": "hello"}],
        extra_body={"ignore_eos": True},
    )
    text, usage = "", None
    for chunk in chunks:
        text += chunk.choices[0].delta.content or "" if chunk.choices else ""
        usage = getattr(chunk, "usage", None) or usage
    print("litellm stream:", usage.completion_tokens if usage else None, "tokens,", repr(text))


def check_langchain(url: str, key: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="tiny-llama", base_url=url, api_key=key, max_completion_tokens=8,
                      extra_body={"ignore_eos": True})
    message = chat.invoke("hello")
    print("langchain invoke:", message.usage_metadata, repr(message.content))
    streamed = "".join(chunk.content for chunk in chat.stream("hello"))
    print("langchain stream:", repr(streamed))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="sk-sluice-dev")
    args = parser.parse_args()
    check_litellm(args.url, args.api_key)
    check_langchain(args.url, args.api_key)


if __name__ == "__main__":
    main()
