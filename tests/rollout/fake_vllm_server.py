"""A tiny OpenAI-compatible server that answers as vLLM 0.32's does, for the parts of its API tinyrl uses.

It stands in for the boundary we do not own (vLLM's HTTP API) in the main suite, where no vLLM is installed
(`PolicyServer`: the same API answered by tinyrl's transformers engine over a run's own model):
the real server is tested in the vLLM venv (tests/rollout/test_vllm_server.py). Its answers are scripted: a
completion of a prompt whose last token id is t is t+1, t+2, ... (each with logprob -0.5 - 0.01 * k), ending
with EOS (id 1) after `length` tokens or at max_tokens; `fail` queues HTTP statuses (or "hang": no answer for
`hang_s`) that the next requests to a path get first.

    with FakeVLLM() as fake:            # a thread serving on 127.0.0.1:<free port>
        fake.url; fake.loaded; fake.requests; fake.fail["/v1/completions"] = [500, 500]
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EOS = 1


class FakeVLLM:
    def __init__(self, length: int = 4, model: str = "tiny-arith"):
        self.length, self.model = length, model
        self.loaded: dict[str, str] = {}  # adapter name -> path
        self.requests: list[tuple[str, dict]] = []  # (path, body) of every POST
        self.fail: dict[str, list] = {}  # path -> statuses (or "hang") the next requests get first
        self.hang_s = 5.0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeVLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def posts(self, path: str) -> list[dict]:
        with self.lock:
            return [b for p, b in self.requests if p == path]

    def _failure(self, path: str):
        with self.lock:
            queued = self.fail.get(path)
            return queued.pop(0) if queued else None

    def completion(self, body: dict) -> tuple[list[tuple[int, float]], str, str | None]:
        """The scripted tokens (id, logprob) of a request, its finish_reason and stop_reason."""
        last = body["prompt"][-1]
        n = min(body["max_tokens"], self.length)
        out = [(2 + (last + k - 2) % 90, -0.5 - 0.01 * k) for k in range(1, n + 1)]
        if n == self.length:
            out[-1] = (EOS, out[-1][1])
        return out, "stop" if out and out[-1][0] == EOS else "length", None

    def load(self, name: str, path: str) -> None:
        self.loaded[name] = path


    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _failed(self) -> bool:
                f = fake._failure(self.path)
                if f == "hang":
                    time.sleep(fake.hang_s)
                    return True
                if f is not None:
                    self._send(f, {"error": {"message": f"injected {f}", "code": f}})
                    return True
                return False

            def do_GET(self):
                if self._failed():
                    return
                if self.path == "/health":
                    return self._send(200, {})
                if self.path == "/v1/models":
                    data = [{"id": fake.model, "root": f"/models/{fake.model}", "max_model_len": 64, "parent": None}]
                    data += [{"id": n, "root": p, "parent": fake.model} for n, p in fake.loaded.items()]
                    return self._send(200, {"object": "list", "data": data})
                self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with fake.lock:
                    fake.requests.append((self.path, body))
                if self._failed():
                    return
                if self.path == "/v1/load_lora_adapter":
                    fake.load(body["lora_name"], body["lora_path"])
                    return self._send(200, {})
                if self.path == "/v1/unload_lora_adapter":
                    if fake.loaded.pop(body["lora_name"], None) is None:
                        return self._send(404, {"error": {"message": f"The lora adapter '{body['lora_name']}' cannot be found."}})
                    return self._send(200, {})
                if self.path == "/v1/completions":
                    if body["model"] not in fake.loaded:
                        return self._send(404, {"error": {"message": f"The model `{body['model']}` does not exist.",
                                                          "type": "NotFoundError", "code": 404}})
                    return self._complete(body)
                self._send(404, {"detail": "Not Found"})

            def _complete(self, body: dict) -> None:
                toks, finish, stop_reason = fake.completion(body)
                if not body.get("stream"):
                    return self._send(200, {"choices": [{"index": 0, "text": "", "finish_reason": finish,
                                                         "stop_reason": stop_reason, "logprobs": _logprobs(toks)}]})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                step = 1 if isinstance(fake, PolicyServer) is False else max(len(toks), 1)  # one chunk: the policy's
                for k in range(0, max(len(toks), 1), step):
                    last = k + step >= len(toks)
                    chunk = {"choices": [{"index": 0, "text": "", "logprobs": _logprobs(toks[k:k + step]),
                                          "finish_reason": finish if last else None,
                                          "stop_reason": stop_reason if last else None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler


def _logprobs(toks: list[tuple[int, float]]) -> dict:
    return {"tokens": [f"token_id:{t}" for t, _ in toks], "token_logprobs": [lp for _, lp in toks],
            "top_logprobs": None, "text_offset": [0] * len(toks)}


class PolicyServer(FakeVLLM):
    """The fake answering with tinyrl's transformers engine over the run's own base model, loaded as the trainer
    loads it (dtype, quantization, LoRA shape), and the adapter versions it is sent: what a vLLM server would sample,
    in the main suite, which has no vLLM (tests/test_switches.py runs rollout.engine vllm_server against it).
    Requests are decoded one at a time; a streamed answer comes in one chunk."""

    def __init__(self, model_cfg, lora_cfg):
        from tinyrl.model import load_policy
        from tinyrl.rollout.hf import HFEngine

        super().__init__(model=str(model_cfg.name))
        self.policy, self.tok = load_policy(model_cfg, lora_cfg)
        self.engine, self.states, self.decode = HFEngine(self.policy, self.tok), {}, threading.Lock()

    def load(self, name: str, path: str) -> None:
        from safetensors.torch import load_file

        self.states[name] = load_file(f"{path}/adapter_model.safetensors")
        super().load(name, path)

    def completion(self, body: dict):
        from peft import set_peft_model_state_dict

        from tinyrl.rollout.base import SamplingParams

        t = body.get("temperature", 1.0)
        p = SamplingParams(t or 1.0, body.get("top_p", 1.0), body["max_tokens"], list(body.get("stop") or []),
                           stream=body["seed"])
        with self.decode:
            set_peft_model_state_dict(self.policy, self.states[body["model"]])
            smp = self.engine.sample([body["prompt"]], p, greedy=t == 0)[0][0]
        toks = list(zip(smp.token_ids, smp.logprobs))
        return toks, "length" if smp.finish == "length" else "stop", (p.stop[0] if smp.finish == "stop" else None)
