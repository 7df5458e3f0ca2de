"""The real-server run's same-token rule (report.near_ties) and the plain launch the tie check starts."""

from __future__ import annotations

import json
from pathlib import Path

from tests.server_gpu.e2e import plain_args, run_name
from tests.server_gpu.report import TIE_NATS, near_ties

PROMPT = 6


def _ties(tmp_path: Path, top2_at_first: list, before: list[int]) -> Path:
    """A ties.json as e2e.tie_check records SGLang's answer: entry j is input position logprob_start_len + j."""
    start = PROMPT - 1
    ours = [*before, 50]
    ids = [7, *ours]  # the last prompt token, then our tokens
    tops = [[[-0.1, 7, None], [-3.0, 8, None]]] + [[[-0.2, t, None], [-2.0, t + 1, None]] for t in before]
    tops.append(top2_at_first)
    positions = {"8192": {"prompt_len": PROMPT, "logprob_start_len": start,
                          "input_token_logprobs": [[-0.5, t, None] for t in ids], "input_top_logprobs": tops}}
    run = tmp_path / "runs" / "plain"
    run.mkdir(parents=True)
    (run / "ties.json").write_text(json.dumps({"positions": positions}))
    return tmp_path


def _detail(first: int) -> dict:
    return {"8192": {"tokens": 10, "first_difference": first}}


def test_a_near_tie_passes(tmp_path):
    run = _ties(tmp_path, [[-0.70, 50, None], [-0.72, 60, None]], before=[11, 12, 13])
    tokens = {"ddtree": {"8192": [11, 12, 13, 50]}, "sglang": {"8192": [11, 12, 13, 60]}}
    got = near_ties(run, tokens, _detail(3))["8192"]
    assert got["near_tie"] and got["aligned"] and got["third_agrees_before"] == "3/3"
    assert abs(got["top2_gap_nats"] - 0.02) < 1e-9


def test_a_clear_winner_fails(tmp_path):
    run = _ties(tmp_path, [[-0.2, 50, None], [-0.2 - 4 * TIE_NATS, 60, None]], before=[11, 12, 13])
    tokens = {"ddtree": {"8192": [11, 12, 13, 50]}, "sglang": {"8192": [11, 12, 13, 60]}}
    assert not near_ties(run, tokens, _detail(3))["8192"]["near_tie"]


def test_a_third_token_on_top_fails(tmp_path):
    run = _ties(tmp_path, [[-0.70, 50, None], [-0.71, 99, None]], before=[11, 12, 13])
    tokens = {"ddtree": {"8192": [11, 12, 13, 50]}, "sglang": {"8192": [11, 12, 13, 60]}}
    assert not near_ties(run, tokens, _detail(3))["8192"]["near_tie"]


def test_disagreement_before_the_difference_fails(tmp_path):
    run = _ties(tmp_path, [[-0.70, 50, None], [-0.72, 60, None]], before=[11, 12, 13])
    tokens = {"ddtree": {"8192": [11, 12, 13, 50]}, "sglang": {"8192": [11, 12, 13, 60]}}
    ties = json.loads((run / "runs" / "plain" / "ties.json").read_text())
    ties["positions"]["8192"]["input_top_logprobs"][2][0][1] = 77  # the third computation chose otherwise once
    (run / "runs" / "plain" / "ties.json").write_text(json.dumps(ties))
    got = near_ties(run, tokens, _detail(3))["8192"]
    assert not got["near_tie"] and got["third_agrees_before"] == "2/3"


def test_missing_tie_check_is_not_a_tie(tmp_path):
    tokens = {"ddtree": {"8192": [1, 2]}, "sglang": {"8192": [1, 3]}}
    assert near_ties(tmp_path, tokens, _detail(1))["8192"] == {"near_tie": False, "why": "no tie check recorded"}


def test_plain_launch_drops_every_speculative_flag():
    argv = ["--model-path", "/m", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8",
            "--page-size", "1", "--speculative-draft-model-path=/d", "--attention-backend", "triton"]
    assert plain_args(argv) == ["--model-path", "/m", "--page-size", "1", "--attention-backend", "triton",
                                "--disable-cuda-graph"]


def test_the_dsa_reference_is_sglangs_own_dsa_serving():
    """--attention dsa: the reference drops DDTree's page size and the Triton backend, so SGLang picks its own DSA
    path; the runs are named apart from the dense view's."""
    argv = ["--model-path", "/m", "--speculative-algorithm", "DDTREE", "--page-size", "1",
            "--attention-backend", "triton", "--kv-cache-dtype", "bfloat16"]
    assert plain_args(argv, "dsa") == ["--model-path", "/m", "--kv-cache-dtype", "bfloat16", "--disable-cuda-graph"]
    assert run_name("ddtree", "DDTREE", "dsa") == "ddtree-dsa" and run_name("ddtree", "DFLASH") == "ddtree-dflash"


def test_the_tie_check_teacher_forces_our_tokens_up_to_their_first_difference(tmp_path, monkeypatch):
    """What e2e asks the server without speculation (the DSA reference asks it itself, while it is up)."""
    from tests.server_gpu import e2e

    for run, tokens in (("ddtree-dsa", [1, 2, 3, 9, 5]), ("sglang-dsa", [1, 2, 3, 4, 5])):
        (tmp_path / run).mkdir()
        (tmp_path / run / "tokens.json").write_text(json.dumps({"8192": tokens, "131072": [7]}))
    diffs = e2e.first_differences(tmp_path, "dsa")
    assert diffs == {"8192": 3}  # 131072 agrees: nothing asked there
    sent = []

    class Answer:
        def json(self) -> dict:
            return {"meta_info": {"input_token_logprobs": [[-0.1, 1, None]], "input_top_logprobs": [[[-0.1, 1, None]]]}}

    monkeypatch.setattr(e2e.requests, "post", lambda url, json, timeout: sent.append((url, json)) or Answer())
    positions = e2e.top2_at_differences("http://127.0.0.1:1", tmp_path, diffs, "dsa")
    url, body = sent[0]
    prompt = e2e.bench_prompt(8192)
    assert url.endswith("/generate") and len(sent) == 1
    assert body["input_ids"] == [*prompt, 1, 2, 3, 9]  # ours, through the token where they part
    assert (body["logprob_start_len"], body["top_logprobs_num"], body["return_logprob"]) == (len(prompt) - 1, 2, True)
    assert positions["8192"]["logprob_start_len"] == len(prompt) - 1 and positions["8192"]["prompt_len"] == len(prompt)
