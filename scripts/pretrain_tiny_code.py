"""Pretrain tinyrl's shipped code model, tiny-code, on the procedurally generated code world.

    nice -n 10 python scripts/pretrain_tiny_code.py   # writes tinyrl/assets/tiny-code/ (seed 0, 2000 steps; ~5 min on 1 core)
    python scripts/pretrain_tiny_code.py --out /tmp/tc --steps 300 --no-save
    python scripts/pretrain_tiny_code.py --eval-only  # re-measure the saved model

What it makes: a word-level tokenizer whose pieces keep their leading space ("def", " xs",
"    ", "\\n", " ==", one digit, one other character), decoded by plain concatenation, so
the Python the model writes comes back byte for byte; and a small Llama causal LM, saved with
`save_pretrained`. Every plain prompt and solution of the world encodes without <unk>; the
asserts, which the plain prompt does not show, are not covered (`template: default` is not for it).

The examples are the `code` task's plain prompt (`tinyrl.tasks.code.PLAIN_PROMPT`: the bare
description, the ```python fence already opened) of a world problem (tinyrl.tasks.code_world),
drawn afresh for every example from the TRAIN compositions only, with fresh asserts: the model
learns the pattern (one line per clause of the description), not the items. The completion is
the code and the closing fence, what the task's `code_of` reads. What the model believes, drawn
per example, so that sampling at T=1 sometimes passes and greedy decoding rarely does:

- with `--p-skip` (0.6) the plausible shortcut that forgets the first step (`return sum(xs)`
  on the raw argument); the world's asserts always tell it apart from the right program;
- with `--p-wrong-op` (0.1) per line, another operation of the same kind in that line;
- with `--p-no-fence` (0 by default) the code without its closing fence.

The loss sees the completion only (and the end token). The script ends by measuring the model on
the held-out compositions (tinyrl/assets/code-world/test.jsonl) in the sandbox: greedy pass@1,
T=1 pass rate and pass@8, written to pretrain_info.json. The shipped model (326,880 parameters,
1.3 MB; 278 s of pretraining on 1 thread of a shared 2-core machine): held-out greedy pass@1 0.0%,
T=1 pass 26.0%, pass@8 92.3% (78 rows, 39 held-out compositions): greedy writes the shortcut.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import string
import time
from pathlib import Path

import torch

from tinyrl.tasks import code_world as cw

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tinyrl" / "assets" / "tiny-code"
WORLD = ROOT / "tinyrl" / "assets" / "code-world"
SPECIALS = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2
PIECE = r"\n|    | ?[A-Za-z]+| ?[0-9]| ?(?:==|!=|<=|>=|\*\*|//)| ?[^\sA-Za-z0-9]| "
FENCE_OPEN, FENCE_CLOSE = "```python\n", "```"


# --------------------------------------------------------------------------- prompt


def plain_prompt() -> str:
    """The code task's `template: plain` format string: the bare description, the fence already opened."""
    from tinyrl.tasks.code import PLAIN_PROMPT

    return PLAIN_PROMPT


def render_prompt(row: dict) -> str:
    """The code task's plain prompt for a world row, rendered as the task renders it (what RL and evaluation show)."""
    return plain_prompt().format(text=row["text"].rstrip("\n"), entry_point=row["entry_point"], example="")


def completion(code: str, fence: bool = True) -> str:
    """One fenced block; when the prompt itself opens the fence, the completion is the code and the closing fence."""
    opened = plain_prompt().endswith(FENCE_OPEN)
    if not fence:
        return code
    return f"{code}{FENCE_CLOSE}" if opened else f"{FENCE_OPEN}{code}{FENCE_CLOSE}"


# --------------------------------------------------------------------------- tokenizer


def vocabulary_texts(rows: list[dict]) -> list[str]:
    texts = [render_prompt(r) + completion(r["code"]) for r in rows]
    texts += [op.expr for op in cw.OPS] + [cw.text(a, b) for a, b in cw.compositions()]
    words = cw.WORDS + [w.capitalize() for w in cw.WORDS] + [w.upper() for w in cw.WORDS]
    texts += [" ".join(words), "".join(c * 2 for c in " ".join(words)), " ".join(w[::-1] for w in words)]
    texts += [" ".join(w.swapcase()[::-1] for w in words), " ".join(w[:3] for w in words)]
    texts += [" ".join(string.printable.strip()), "".join(string.printable.strip())]
    return texts


def make_tokenizer(texts: list[str]):
    """A PreTrainedTokenizerFast over the pieces of `texts` (no BOS, pad != eos), decoded by concatenation."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = sorted({p for t in texts for p in re.findall(PIECE, t)})
    vocab = {t: i for i, t in enumerate(SPECIALS + [p for p in pieces if p not in SPECIALS])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False)


def make_model(tok, args):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.hidden * args.mlp_ratio,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model


# --------------------------------------------------------------------------- examples


def sample(pairs, rng: random.Random, args) -> tuple[str, str]:
    """(prompt, completion) of a fresh problem of a train composition, with the module docstring's noise."""
    a, b = rng.choice(pairs)
    row = cw.row(a, b, rng, "pretrain")
    skip = rng.random() < args.p_skip
    first, second = a, b
    if rng.random() < args.p_wrong_op:
        first = rng.choice([o for o in cw.OPS if o.kind == a.kind and o.transform and o is not a])
    if rng.random() < args.p_wrong_op:
        second = rng.choice([o for o in cw.OPS if o.kind == a.kind and o is not b])
    code = cw.program(first, second, skip_first=skip).replace(cw.name(first, second), cw.name(a, b))
    return render_prompt(row), completion(code, fence=rng.random() >= args.p_no_fence)


def encode(prompt: str, comp: str, tok) -> tuple[list[int], list[int]]:
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = tok(comp, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + c, [-100] * len(p) + c


def batches(pairs, tok, rng: random.Random, args, pool: int = 8):
    """Endless right-padded batches (pools of similar length)."""
    while True:
        rows = sorted((encode(*sample(pairs, rng, args), tok) for _ in range(args.batch_size * pool)),
                      key=lambda r: len(r[0]))
        chunks = [rows[i:i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            L = max(len(r[0]) for r in chunk)
            yield (torch.tensor([r[0] + [tok.pad_token_id] * (L - len(r[0])) for r in chunk]),
                   torch.tensor([[1] * len(r[0]) + [0] * (L - len(r[0])) for r in chunk]),
                   torch.tensor([r[1] + [-100] * (L - len(r[1])) for r in chunk]))


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def generate(model, tok, prompts: list[str], temperature: float, n: int, max_new_tokens: int, seed: int) -> list[str]:
    model.eval()
    tok.padding_side = "left"
    torch.manual_seed(seed)
    out = []
    for i in range(0, len(prompts), 32):
        enc = tok(prompts[i:i + 32], return_tensors="pt", padding=True, add_special_tokens=False)
        kw = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, num_return_sequences=n, **kw)
        out += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    model.train()
    return out


def evaluate(model, tok, rows: list[dict], args, n: int = 8) -> dict:
    """Greedy pass@1, T=1 pass rate and pass@n on `rows`, the completions run in the sandbox."""
    from tinyrl.rewards.code import run_completions
    from tinyrl.tasks.code import code_of

    def passed(completions: list[str], tests: list[list[str]]) -> list[float]:
        opened = {"open_fence": plain_prompt().endswith(FENCE_OPEN)}
        results = run_completions([code_of(c, opened) for c in completions], tests)
        return [float(r is not None and r.status == "ok" and r.score == 1.0) for r in results]

    prompts = [render_prompt(r) for r in rows]
    t0 = time.time()
    greedy = generate(model, tok, prompts, 0.0, 1, args.max_new_tokens, args.seed)
    g = passed(greedy, [r["test_list"] for r in rows])
    sampled = generate(model, tok, prompts, 1.0, n, args.max_new_tokens, args.seed)
    s = passed(sampled, [r["test_list"] for r in rows for _ in range(n)])
    per_row = [max(s[i * n:(i + 1) * n]) for i in range(len(rows))]
    closed = sum(FENCE_CLOSE in c for c in sampled) / len(sampled)
    return {"rows": len(rows), "greedy_pass@1": sum(g) / len(rows), "t1_pass": sum(s) / len(s),
            f"pass@{n}": sum(per_row) / len(rows), "t1_closed_fence": closed,
            "seconds": round(time.time() - t0, 1), "greedy_example": prompts[0] + greedy[0]}


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pretrain(model, tok, pairs, args, check_rows: list[dict]) -> float:
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    model.train()
    t0, ema = time.time(), None
    stream = batches(pairs, tok, rng, args)
    for step in range(1, args.steps + 1):
        input_ids, mask, labels = next(stream)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step:5d}  loss {ema:.4f}  lr {sched.get_last_lr()[0]:.2e}  {time.time() - t0:6.1f}s", flush=True)
        if args.check_every and step % args.check_every == 0 and step < args.steps:
            t1 = time.time()
            m = evaluate(model, tok, check_rows, args, n=4)
            print(f"    held-out check: greedy {m['greedy_pass@1']:.3f}  T=1 {m['t1_pass']:.3f}  "
                  f"pass@4 {m['pass@4']:.3f}", flush=True)
            t0 += time.time() - t1  # the check is not pretraining time
    return time.time() - t0


def save(model, tok, out: Path, info: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.padding_side = "right"  # the saved default; tinyrl loads it with padding_side="left"
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"  # name the class every transformers >= 4 knows
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "pretrain_info.json").write_text(json.dumps(info, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--p-skip", type=float, default=0.6, help="chance of the shortcut that skips the first step")
    p.add_argument("--p-wrong-op", type=float, default=0.1, help="chance, per line, of another operation")
    p.add_argument("--p-no-fence", type=float, default=0.0, help="chance the code comes without its fence")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--mlp-ratio", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--log-every", type=int, default=200)
    p.add_argument("--check-every", type=int, default=400)
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--eval-only", action="store_true", help="evaluate the model saved in --out (refreshes its info)")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    train_rows, test_rows = read_rows(WORLD / "train.jsonl"), read_rows(WORLD / "test.jsonl")
    if args.eval_only:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.out, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(args.out)
        metrics = evaluate(model, tok, test_rows, args)
        print(json.dumps(metrics, indent=2))
        info_path = args.out / "pretrain_info.json"
        if info_path.exists():
            info = json.loads(info_path.read_text())
            info["held_out"] = metrics
            info_path.write_text(json.dumps(info, indent=2) + "\n")
        return

    train_pairs, _ = cw.split(0)
    tok = make_tokenizer(vocabulary_texts(train_rows + test_rows))
    model = make_model(tok, args)
    n_params = sum(t.numel() for t in model.parameters())
    print(f"tiny-code: {n_params:,} parameters ({n_params * 4 / 1e6:.2f} MB float32), vocab {len(tok)}")
    seconds = pretrain(model, tok, train_pairs, args, test_rows[:40])
    print(f"pretraining took {seconds:.0f}s on {args.threads} threads")
    metrics = evaluate(model, tok, test_rows, args)
    print(json.dumps(metrics, indent=2))
    if not args.no_save:
        info = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                         if k not in ("out", "no_save", "eval_only")},
                "parameters": n_params, "vocab": len(tok), "pretrain_seconds": round(seconds, 1),
                "held_out": metrics}
        save(model, tok, args.out, info)
        print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
