"""The stand-in server answers in the shape the real SGLang server did (real_answers.json).

real_answers.json holds what a real DDTree server (the ddtree-v2 build, patched, our kernel, on an
H200) answered to the requests our smoke and bench clients send (tests/server_gpu/e2e.py records it).
Each of the stand-in's answers to the same request must carry every field the real one did, with the
same JSON type (a real null matches anything), and its streams must have the real ones' sequence:
an empty first delta that names the role, content chunks, the finish chunk, the usage chunk, [DONE].
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import requests

from .standin_server import Behaviour, StandInServer

REAL = json.loads((Path(__file__).with_name("real_answers.json")).read_text())


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def missing(real, ours, path: str = "") -> list[str]:
    """Paths where `ours` lacks a field `real` has, or holds another JSON type."""
    if real is None:
        return []
    if _kind(real) != _kind(ours):
        return [f"{path or '.'}: real {_kind(real)}, stand-in {_kind(ours)}"]
    if isinstance(real, dict):
        out = []
        for key, value in real.items():
            if key not in ours:
                out.append(f"{path}.{key}: missing")
            else:
                out += missing(value, ours[key], f"{path}.{key}")
        return out
    if isinstance(real, list) and real and ours:
        return missing(real[0], ours[0], f"{path}[0]")
    return []


def _events(lines: list[str]) -> list:
    assert all(line.startswith("data: ") for line in lines), lines[:3]
    return [line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]) for line in lines]


def _stream(url: str, path: str, body: dict) -> list[str]:
    with requests.post(url + path, json=body, stream=True, timeout=30) as resp:
        return [line for line in resp.iter_lines(decode_unicode=True) if line]


def test_health_while_warming_up_is_an_empty_503_then_an_empty_200():
    real = REAL["health_while_starting"]
    assert [(h["status"], h["body"]) for h in real] == [(503, ""), (200, "")]
    with StandInServer(Behaviour(warmup_s=0.5)) as url:
        first = requests.get(url + "/health_generate", timeout=10)
        time.sleep(0.6)
        then = requests.get(url + "/health_generate", timeout=10)
    assert (first.status_code, first.text) == (503, "") and (then.status_code, then.text) == (200, "")


def test_models_and_server_info_carry_the_real_fields():
    with StandInServer(Behaviour(accept_length=2)) as url:
        models = requests.get(url + "/v1/models", timeout=10).json()
        info = requests.get(url + "/server_info", timeout=10).json()
    assert missing(REAL["models"], models) == []
    # The real server had served no speculative step yet, so its internal state had no acceptance length;
    # the stand-in's carries one, and every field the real one had.
    assert missing(REAL["server_info"], info) == []
    assert info["internal_states"][0]["avg_spec_accept_length"] == 2.0


def test_chat_answers_have_the_real_shape():
    body = {"model": "glm-5", "messages": [{"role": "user", "content": "w10 w20 w30"}], "temperature": 0,
            "max_tokens": 16}
    with StandInServer(Behaviour(default_completion_tokens=16)) as url:  # the random model never stopped early
        chat = requests.post(url + "/v1/chat/completions", json=body, timeout=30).json()
        stream = _events(_stream(url, "/v1/chat/completions",
                                 body | {"stream": True, "stream_options": {"include_usage": True}}))
    assert missing(REAL["chat"], chat) == []
    real = _events(REAL["chat_stream"])
    assert real[-1] == stream[-1] == "[DONE]"
    # first: the role with empty content; then content; the finish chunk; the usage chunk (no choices)
    for got in (real, stream):
        assert got[0]["choices"][0]["delta"] == got[0]["choices"][0]["delta"] | {"role": "assistant", "content": ""}
        assert got[-2]["choices"] == [] and got[-2]["usage"]["completion_tokens"] == 16
        assert got[-3]["choices"][0]["finish_reason"] == "length"
    for i in (0, 1, -3, -2):
        assert missing(real[i], stream[i]) == [], i


def test_generate_stream_has_the_real_shape():
    body = {"input_ids": list(range(100, 164)), "sampling_params": {"max_new_tokens": 16, "temperature": 0,
                                                                     "ignore_eos": True}, "stream": True}
    with StandInServer() as url:
        stream = _events(_stream(url, "/generate", body))
    real = _events(REAL["generate_stream"])
    assert real[-1] == stream[-1] == "[DONE]"
    for got in (real, stream):  # text and output_ids are cumulative; the last event closes the request
        assert len(got[-2]["output_ids"]) == got[-2]["meta_info"]["completion_tokens"] == 16
        assert got[-2]["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    assert missing(real[0], stream[0]) == []
    assert missing(real[-2], stream[-2]) == []
