"""The stand-in server answers as SGLang does: checked by the `openai` client and by SGLang's own models."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from ddtree_ops.smoke import LONG_PROMPT, PROMPT

from .sglang_protocol import load_protocol


@pytest.fixture(scope="module")
def protocol():
    return load_protocol("0.5.23")


def test_openai_client_reads_every_answer(standin):
    client = openai.OpenAI(base_url=standin() + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["glm-5"]
    answer = client.chat.completions.create(model="glm-5", messages=[{"role": "user", "content": PROMPT}],
                                            temperature=0, max_tokens=8)
    assert answer.choices[0].message.content and answer.usage.total_tokens == (
        answer.usage.prompt_tokens + answer.usage.completion_tokens)
    chunks = list(client.chat.completions.create(model="glm-5", messages=[{"role": "user", "content": PROMPT}],
                                                 max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == 8


def test_sglang_models_validate_answers_and_our_requests(standin, protocol):
    url = standin()
    protocol.ModelList.model_validate(requests.get(url + "/v1/models").json())
    # The bodies the smoke test sends are valid SGLang requests (ignore_eos, return_spec_tokens_details, ...).
    body = {"model": "glm-5", "messages": [{"role": "user", "content": LONG_PROMPT}], "temperature": 0,
            "max_tokens": 64, "ignore_eos": True, "return_spec_tokens_details": True}
    protocol.ChatCompletionRequest.model_validate(body)
    raw = requests.post(url + "/v1/chat/completions", json=body).json()
    answer = protocol.ChatCompletionResponse.model_validate(raw)
    assert answer.sglext.spec_tokens_details.spec_accept_length > 1
    stream_body = dict(body, stream=True, stream_options={"include_usage": True})
    protocol.ChatCompletionRequest.model_validate(stream_body)
    with requests.post(url + "/v1/chat/completions", json=stream_body, stream=True) as resp:
        events = [line[6:] for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    for e in events[:-1]:
        protocol.ChatCompletionStreamResponse.model_validate(json.loads(e))
