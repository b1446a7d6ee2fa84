"""Pretrain tinyrl's shipped base model, tiny-arith, for the built-in "arithmetic" task.

    python scripts/pretrain_tiny.py            # writes tinyrl/assets/tiny-arith/ (2000 steps: ~80 s on 2 idle cores)
    python scripts/pretrain_tiny.py --out /tmp/tiny --steps 500

What it makes: a character-level tokenizer (newline and printable ASCII, one token each;
<pad>, </s>, <unk>; no BOS; letters are in the vocabulary too because transformers'
stop-string matcher tokenizes "abcdef" to read the vocabulary) and a small Llama causal
LM, saved with `save_pretrained` (safetensors, float32), loadable offline with plain
`AutoTokenizer` / `AutoModelForCausalLM`.

What the model believes, and why. The demo needs a base model whose *greedy* answer is
often wrong while *sampling* often finds the right one, so GRPO has something to select.
So the pretraining text teaches a systematic misconception: in a sum that carries (about
74% of 2-digit sums), the text gives the carry-less answer (each digit (a_i + b_i) mod 10,
`37+48=75`) with probability `--p-drop` (0.65), drawn afresh every time the sum is shown,
and the true sum otherwise. Sums without a carry are always right. A model that learns
this text well puts about 0.65 on the wrong answer and 0.35 on the right one for a carrying
sum: greedy decoding picks the wrong one, eight samples at temperature 1 usually include
the right one, and RL only has to tip a 65/35 belief the right way (it need not teach
addition). Nothing else is wrong in the text: the format is always `a+b=` then the answer
digits then </s>. The shipped model (seed 0) learned the belief a little less sharply than
the text: on the default held-out rows its greedy accuracy is 0.435 (1.0 on sums without
a carry, 0.26 on carrying ones, where 72% of greedy answers are the carry-less sum),
pass@8 0.87, per-sample accuracy 0.42 (pretrain_info.json holds the figures).

Held-out problems (the task's held-out pool, `tinyrl.tasks.arithmetic.is_held_out`) never
appear in the pretraining text, so held-out accuracy measures generalisation. The script
ends by printing greedy accuracy and pass@8 at temperature 1.0 on the task's default
held-out rows (num_eval=200, seed=0). Everything is seeded (`--seed`); on the same torch
build and thread count the weights come out the same.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from tinyrl.tasks.arithmetic import build, carryless_sum, has_carry, is_correct, is_held_out, operand_range

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tinyrl" / "assets" / "tiny-arith"
SPECIALS = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2
CHARS = "\n" + "".join(map(chr, range(32, 127)))  # newline + printable ASCII: any prompt encodes


def make_tokenizer():
    """A char-level PreTrainedTokenizerFast: one token per character, no BOS, pad != eos."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")  # (?m): "." matches "\n" too
    tk.decoder = decoders.Fuse()  # join characters without spaces
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def make_model(tok, args):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model


def corpus_answer(a: int, b: int, rng: random.Random, p_drop: float) -> str:
    """The answer the pretraining text shows: carry-less with probability p_drop when a+b carries."""
    if has_carry(a, b) and rng.random() < p_drop:
        return str(carryless_sum(a, b))
    return str(a + b)


def make_batch(pairs, tok, rng: random.Random, p_drop: float):
    """Right-padded `a+b=<answer></s>` rows; the loss sees only the answer and </s>."""
    ids = tok.convert_tokens_to_ids
    rows, labels = [], []
    for a, b in pairs:
        prompt, answer = ids(list(f"{a}+{b}=")), ids(list(corpus_answer(a, b, rng, p_drop))) + [tok.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    L = max(map(len, rows))
    pad = tok.pad_token_id
    input_ids = torch.tensor([r + [pad] * (L - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows])
    label_t = torch.tensor([y + [-100] * (L - len(y)) for y in labels])
    return input_ids, mask, label_t


def pretrain(model, tok, args) -> float:
    ops = operand_range(args.digits)
    pool = [(a, b) for a in ops for b in ops if not is_held_out(a, b)]
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    model.train()
    t0, ema = time.time(), None
    for step in range(1, args.steps + 1):
        input_ids, mask, labels = make_batch(rng.choices(pool, k=args.batch_size), tok, rng, args.p_drop)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % args.log_every == 0 or step == args.steps:
            print(f"step {step:5d}  loss {ema:.4f}  lr {sched.get_last_lr()[0]:.2e}  {time.time() - t0:6.1f}s", flush=True)
    return time.time() - t0


@torch.no_grad()
def evaluate(model, tok, rows: list[dict], k: int = 8, temperature: float = 1.0, seed: int = 0) -> dict:
    """Greedy accuracy, pass@k at `temperature`, and how often greedy gives the carry-less sum."""
    model.eval()
    enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    P = enc["input_ids"].shape[1]
    common = dict(max_new_tokens=max_new_tokens_for(rows), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    greedy = tok.batch_decode(model.generate(**enc, do_sample=False, **common)[:, P:], skip_special_tokens=True)
    torch.manual_seed(seed)
    sampled = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             num_return_sequences=k, **common)
    samples = tok.batch_decode(sampled[:, P:], skip_special_tokens=True)
    right = [is_correct(g, r) for g, r in zip(greedy, rows)]
    hits = [sum(is_correct(s, r) for s in samples[i * k:(i + 1) * k]) for i, r in enumerate(rows)]
    carry = [r["carry"] for r in rows]
    n_carry = max(1, sum(carry))
    return {
        "greedy_acc": sum(right) / len(rows),
        f"pass@{k}": sum(h > 0 for h in hits) / len(rows),
        "sample_acc": sum(hits) / (k * len(rows)),
        "greedy_acc_carry": sum(x for x, c in zip(right, carry) if c) / n_carry,
        "greedy_acc_no_carry": sum(x for x, c in zip(right, carry) if not c) / max(1, len(rows) - sum(carry)),
        "greedy_carryless_carry": sum(g == str(carryless_sum(r["a"], r["b"])) for g, r in zip(greedy, rows) if r["carry"]) / n_carry,
        "greedy_format_ok": sum(g.isdigit() for g in greedy) / len(rows),
        "examples": [f"{r['prompt']}{g}" for r, g in zip(rows[:6], greedy[:6])],
    }


def max_new_tokens_for(rows: list[dict]) -> int:
    return max(len(r["answer"]) for r in rows) + 2  # answer digits + </s>, one spare


def save(model, tok, out: Path, info: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"  # name the class every transformers >= 4 knows
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "pretrain_info.json").write_text(json.dumps(info, indent=2) + "\n")


def report(metrics: dict, n: int) -> None:
    print(f"held-out ({n} prompts): greedy accuracy {metrics['greedy_acc']:.3f}, "
          f"pass@8 at T=1.0 {metrics['pass@8']:.3f}, per-sample accuracy {metrics['sample_acc']:.3f}")
    print(f"  greedy on carrying sums {metrics['greedy_acc_carry']:.3f} (carry-less answer "
          f"{metrics['greedy_carryless_carry']:.3f}), on sums without a carry {metrics['greedy_acc_no_carry']:.3f}")
    print("  e.g. " + "  ".join(metrics["examples"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--p-drop", type=float, default=0.65, help="chance a carrying sum is shown carry-less")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--num-eval", type=int, default=200)
    p.add_argument("--log-every", type=int, default=250)
    p.add_argument("--no-save", action="store_true", help="train and evaluate only")
    p.add_argument("--eval-only", action="store_true",
                   help="evaluate the model saved in --out (and refresh the held_out figures of its pretrain_info.json)")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    # the trainer's default held-out rows (data.seed=0, data.num_eval=200)
    _, held_out = build(num_train=0, num_eval=args.num_eval, seed=0, digits=args.digits)
    if args.eval_only:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.out, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(args.out)
        metrics = evaluate(model, tok, held_out, k=8, temperature=1.0, seed=args.seed)
        report(metrics, len(held_out))
        info_path = args.out / "pretrain_info.json"
        if info_path.exists():
            info = json.loads(info_path.read_text())
            info["held_out"] = {k: v for k, v in metrics.items() if k != "examples"}
            info_path.write_text(json.dumps(info, indent=2) + "\n")
        return

    tok = make_tokenizer()
    tok.padding_side = "left"  # for the closing evaluation; training rows are padded by hand
    model = make_model(tok, args)
    n_params = sum(t.numel() for t in model.parameters())
    print(f"tiny-arith: {n_params:,} parameters ({n_params * 4 / 1e6:.2f} MB float32), vocab {len(tok)}")
    seconds = pretrain(model, tok, args)
    print(f"pretraining took {seconds:.0f}s on {args.threads} threads")
    metrics = evaluate(model, tok, held_out, k=8, temperature=1.0, seed=args.seed)
    report(metrics, len(held_out))
    if not args.no_save:
        tok.padding_side = "right"  # the saved default; tinyrl loads it with padding_side="left"
        info = {"args": {k: v for k, v in vars(args).items() if k not in ("out", "no_save", "eval_only")},
                "parameters": n_params, "pretrain_seconds": round(seconds, 1),
                "held_out": {k: v for k, v in metrics.items() if k != "examples"}}
        save(model, tok, args.out, info)
        print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
