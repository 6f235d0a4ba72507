#!/usr/bin/env python3
"""Precise prefix prediction from vLLM's KV events: a measured prototype.

Starts a vLLM server on CPU (the virtualenv of scripts/setup-vllm.sh) with KV
events published over ZMQ to a socket this script binds, keeps an index of the
blocks the server holds from the events (`BlockStored` carries each block's
token ids and its parent's hash, `BlockRemoved` and `AllBlocksCleared` take
them away), and before each request predicts the tokens the server will find
cached: the request is tokenized with the model's own chat template, cut in
the server's 128-token blocks, and matched against the index. The
prediction is compared with the `cached_tokens` vLLM reports for the request.

The index keys blocks by its own chained hash of token ids (parent, tokens,
adapter), learned from the events: vLLM's own block hashes are seeded per
process and need not be reproduced. Run with the venv's Python:

  "$(scripts/setup-vllm.sh)/bin/python" scripts/kv-events-prototype.py

Prints precision, recall and the per-request cost of the prediction
(tokenizing with the chat template, and hashing and matching).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import msgspec
import zmq
from transformers import AutoTokenizer
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

BLOCK = 128
ROOT = 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Index:
    """The server's blocks, by our chained hash of their token ids."""

    def __init__(self):
        self.ours = {}  # vLLM's block hash -> ours
        self.present = set()
        self.lock = threading.Lock()
        self.events = 0

    def apply(self, ev):
        with self.lock:
            self.events += 1
            if isinstance(ev, BlockStored):
                parent = ROOT if ev.parent_block_hash is None else self.ours.get(ev.parent_block_hash)
                if parent is None:
                    return  # a parent we never saw: its chain cannot be matched
                size = ev.block_size
                for i, h in enumerate(ev.block_hashes):
                    toks = tuple(ev.token_ids[i * size:(i + 1) * size])
                    parent = hash((parent, toks, ev.lora_name))
                    self.ours[h] = parent
                    self.present.add(parent)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    ours = self.ours.pop(h, None)
                    if ours is not None:
                        self.present.discard(ours)
            elif isinstance(ev, AllBlocksCleared):
                self.ours.clear()
                self.present.clear()

    def predict(self, tokens, lora=None):
        """Tokens of the longest run of whole blocks the server holds."""
        parent, n = ROOT, 0
        with self.lock:
            # vLLM never reuses the last token of a prompt: it must compute it.
            for i in range(0, len(tokens) - 1 - BLOCK + 1, BLOCK):
                parent = hash((parent, tuple(tokens[i:i + BLOCK]), lora))
                if parent not in self.present:
                    break
                n += BLOCK
        return n


def subscribe(ctx, endpoint, index, stop):
    sub = ctx.socket(zmq.SUB)
    sub.bind(endpoint)  # vLLM connects to a concrete tcp://host:port
    sub.setsockopt_string(zmq.SUBSCRIBE, "kv")
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    while not stop.is_set():
        if not poller.poll(100):
            continue
        _topic, _seq, payload = sub.recv_multipart()
        for ev in decoder.decode(payload).events:
            index.apply(ev)
    sub.close()


def chat(url, messages, max_tokens=16):
    body = json.dumps({"model": "smollm2", "messages": messages,
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        v = json.load(r)
    u = v["usage"]
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return v["choices"][0]["message"]["content"], u["prompt_tokens"], cached


# The workloads of tests/src/bin/fleetroute-prefix-precision.rs, the same texts.
TOPICS = ["tides", "glaciers", "bees", "lighthouses"]


def chat_workload():
    system = ("You are a patient tutor. Answer in two or three short sentences, "
              "plainly, and end with a question that checks understanding. ") * 4
    convs = [[{"role": "system", "content": system},
              {"role": "user", "content": f"Teach me about {t}. " + "I know nothing yet. " * 10}]
             for t in TOPICS]
    for step in range(6):
        for c in convs:
            answer = yield c
            c.append({"role": "assistant", "content": answer})
            c.append({"role": "user", "content": f"Thanks. Now question {step}: why does that happen, in more detail?"})


def agent_workload():
    tools = [{"name": f"tool_{i}", "description": f"Tool number {i}: looks up records of kind {i} in the inventory and returns them as a table with columns id, name, quantity and location.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}} for i in range(12)]
    system = "You are an inventory agent. Call one tool per step by writing TOOL name(query). Tools:\n" + json.dumps(tools, indent=2)
    tasks = [[{"role": "system", "content": system},
              {"role": "user", "content": f"Task {i}: find every item of kind {i % 5} stored in warehouse {i}."}]
             for i in range(8)]
    for step in range(3):
        for i, t in enumerate(tasks):
            answer = yield t
            t.append({"role": "assistant", "content": answer})
            t.append({"role": "user", "content": f"TOOL RESULT step {step}: " + f"| {i} | item | 3 | shelf {step} |\n" * 6})


def run(workload, url, tok, index):
    rows, costs_tpl, costs_match = [], [], []
    gen = workload()
    messages = next(gen)
    while True:
        time.sleep(0.05)  # the previous request's events: a router sees them within ms
        t0 = time.perf_counter()
        tokens = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(tokens, dict) or hasattr(tokens, "input_ids"):
            tokens = tokens["input_ids"]
        t1 = time.perf_counter()
        predicted = index.predict(list(tokens))
        t2 = time.perf_counter()
        answer, prompt, cached = chat(url, messages)
        rows.append((predicted, cached, prompt, len(tokens)))
        costs_tpl.append((t1 - t0) * 1000)
        costs_match.append((t2 - t1) * 1000)
        try:
            messages = gen.send(answer)
        except StopIteration:
            return rows, costs_tpl, costs_match


def figures(rows):
    both = sum(min(p, a) for p, a, _, _ in rows)
    pred = sum(p for p, _, _, _ in rows)
    act = sum(a for _, a, _, _ in rows)
    same_len = sum(1 for _, _, prompt, n in rows if prompt == n)
    return (both / pred if pred else float("nan"), both / act if act else float("nan"),
            pred, act, sum(r[2] for r in rows), same_len)


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def main():
    venv = os.path.dirname(os.path.dirname(sys.executable))
    model = os.path.join(venv, "models", "smollm2-hf")
    port, events_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{events_port}"
    index, stop = Index(), threading.Event()
    ctx = zmq.Context()
    listener = threading.Thread(target=subscribe, args=(ctx, endpoint, index, stop), daemon=True)
    listener.start()
    log = tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
         "--enforce-eager", "--max-model-len", "2048", "--enable-prefix-caching",
         "--enable-prompt-tokens-details", "--kv-events-config",
         json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": endpoint, "topic": "kv"})],
        stdout=log, stderr=subprocess.STDOUT, env=env,
        # Its engine core and workers are processes of their own: one group,
        # stopped whole.
        start_new_session=True)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                if server.poll() is not None:
                    sys.exit(f"vLLM exited; see {log.name}")
                time.sleep(1)
        tok = AutoTokenizer.from_pretrained(model)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        print("workload  requests  prompt_tokens  reused(engine)  predicted  precision  recall  "
              "same_token_count  template_ms_p50  match_ms_p50")
        for name, w in (("chat", chat_workload), ("agent", agent_workload)):
            rows, tpl, match = run(w, url, tok, index)
            p, r, pred, act, prompt, same = figures(rows)
            print(f"{name:<8}  {len(rows):>8}  {prompt:>13}  {act:>14}  {pred:>9}  {p:>9.3f}  {r:>6.3f}  "
                  f"{same:>10}/{len(rows):<5}  {median(tpl):>15.3f}  {median(match):>12.4f}")
        print(f"events received: {index.events}")
    finally:
        stop.set()
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
