"""Pretrain tinyrl's shipped search-agent base model, tiny-search, on the offline search world.

    nice -n 10 python scripts/pretrain_tiny_search.py   # writes tinyrl/assets/tiny-search/ (seed 0, 3000 steps; ~8 min on 1 core beside a 2-thread job)
    python scripts/pretrain_tiny_search.py --out /tmp/ts --steps 300 --no-save
    python scripts/pretrain_tiny_search.py --eval-only # re-measure the saved model

What it makes: a word-level tokenizer over the closed world (every name part, city, job and
template word, the Search-R1 tags and passage layout, the tools' fixed error lines: every
observation the search tool can return encodes without <unk>; whitespace is not a token, the
decoder joins tokens with spaces) and a small Llama causal LM, saved with `save_pretrained`.
Word-level keeps trajectories short (a two-hop episode with top-3 passages is ~230 tokens,
against ~1,300 characters), which is what makes CPU RL in minutes possible. Names are a first
and a last name from two pools shared by both sides of the split, so every token of a held-out
name was trained on even though the held-out people never appear.

What the model believes, and why. RL needs a base model that *sometimes* does the right thing
and often something plausible but wrong, drawn afresh every time, so that sampling finds the
right behaviour while greedy decoding does not. The pretraining episodes (train-side people only)
are the Search-R1 protocol (`Question: ...` / `<search> q </search>` / the real search tool's
`<information>` observation / `<answer> a </answer>`), with these choices, each drawn per episode:

- first move: search with probability `--p-search` (0.4); otherwise answer at once with a
  random city / job / person (a guess: right about 1 time in 16-240);
- the query: the entity's full name with `--p-good-query` (0.8); otherwise a poor one (the first
  name alone, the last name alone, or another person's name), which retrieves the wrong document;
- after a wrong document: search again with `--p-retry` (0.5), else answer from the wrong document;
- two-hop questions, after the first document: search the teacher with `--p-second` (0.4),
  else stop after one hop and answer the entity's own city / job (plausible, wrong);
- then the answer is copied from the first passage of the last observation, and </s>.

Besides the 240 train-side people, episodes are about `--invented` (1000) pretraining-only people:
first/last pairs of the same pools that name nobody in the world, with random facts, in documents
of the world's own layout, searched by the same BM25 index. With only the train-side people a
small model memorises their facts instead of reading the passage (measured: answer copied from a
forced correct search 40% on train people, 7.5% on held-out ones); with 1,240 people reading is
the cheaper solution, and reading is what held-out questions need. With `--redraw` (the default)
the invented people are drawn afresh (new name pairs, new facts) for every pool of 16 batches, so
their facts cannot be memorised at all: measured on the same 3000 steps, held-out T=1 EM 8.3% ->
14.0%, pass@8 45% -> 58%, and tiny_search_cpu's RL gain (seed 0, 60 steps) +12.5 -> +60 EM points.

The loss sees the model's tokens only (not the prompt, not the observations), exactly the tokens
the policy samples in RL; the observations come from the real search tool, tokenized on their
own as the multi-turn loop splices them. Episodes use a BM25 index over the *train-side*
documents only, so no held-out person appears anywhere in the pretraining text; at evaluation
(and in RL) the tool searches the whole corpus. The script ends by measuring the model on the
held-out questions with `tinyrl.agents.probe` (greedy EM, EM and pass@8 at T=1, searches per
question), with the search tool and without it (every call answered by the unknown-tool line).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import torch

from tinyrl.agents.formats import SearchR1Format
from tinyrl.agents.prompts import question_prompt
from tinyrl.agents.retrieval import NO_RESULTS, BM25Retriever, format_passages, read_corpus, split_contents
from tinyrl.agents.tools import ERROR_KINDS, ToolResult, error_text
from tinyrl.agents.world import QUESTIONS, SENTENCES, Person, document, read_world

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tinyrl" / "assets" / "tiny-search"
WORLD = ROOT / "tinyrl" / "assets" / "search-world"
SPECIALS = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2
TAGS = ["<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>", "<think>", "</think>"]
PIECE = r"</?[a-z_]+>|[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]"  # a tag, a word, a number, one other character
TEMPLATE = "plain"


# --------------------------------------------------------------------------- tokenizer


def vocabulary_texts(world, docs: list[dict]) -> list[str]:
    """Every text the tokenizer must encode: prompts, passages, tool error lines, tags."""
    fmt = SearchR1Format()
    texts = [question_prompt(t.format(x="X"), TEMPLATE) for t, _ in QUESTIONS.values()]
    texts += [s for s in SENTENCES.values()] + TAGS + [NO_RESULTS, " ".join(str(i) for i in range(10))]
    texts += [fmt.observation([ToolResult(format_passages([d]))]) for d in docs]
    texts += [error_text(k, names) for k in ERROR_KINDS for names in ([], ["search"], ["search", "python"])]
    texts += [error_text("bad_arguments", signature=s) for s in ("search(query)", "python(code)")]
    texts += world.first_names + world.last_names + world.cities + world.jobs
    return texts


def make_tokenizer(texts: list[str]):
    """A word-level PreTrainedTokenizerFast over the pieces of `texts` (no BOS, pad != eos)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = sorted({p for t in texts for p in re.findall(PIECE, t)})
    vocab = {t: i for i, t in enumerate(SPECIALS + [p for p in pieces if p not in SPECIALS])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(PIECE), behavior="isolated")])
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


# --------------------------------------------------------------------------- episodes


def invented_people(world, n: int, rng: random.Random) -> list[Person]:
    """n pretraining-only people: first/last pairs of the world's pools that name nobody in the world,
    with facts drawn at random (teachers among themselves). So many people that their facts cannot be
    memorised: the model has to read them off the passage, which is what held-out questions need."""
    used = {p.name for p in world.people}
    pairs = [(f, la) for f in world.first_names for la in world.last_names if f"{f} {la}" not in used]
    chosen = rng.sample(pairs, min(n, len(pairs)))
    names = [f"{f} {la}" for f, la in chosen]
    return [Person(name, f, la, rng.choice(world.cities), rng.choice(world.jobs),
                   rng.choice([m for m in names if m != name]), "pretrain") for (f, la), name in zip(chosen, names)]


def question_rows(people: list[Person]) -> list[dict]:
    """The five questions about each person, as search_qa rows (prompt + metadata)."""
    return [{"prompt": question_prompt(template.format(x=p.name), TEMPLATE),
             "metadata": {"type": qtype, "hops": hops, "entity": p.name}}
            for p in people for qtype, (template, hops) in QUESTIONS.items()]


class Episodes:
    """Pretraining episodes over the train-side people (and `--invented` pretraining-only people), with
    the behaviours of the module docstring."""

    def __init__(self, world, rows: list[dict], docs: list[dict], args):
        self.people = world.by_name()
        self.train_names = [p.name for p in world.people if p.split == "train"]
        self.cities, self.jobs = world.cities, world.jobs
        train = set(self.train_names)
        self.world, self.args, self.fmt = world, args, SearchR1Format()
        self.train_people, self.train_rows = dict(self.people), list(rows)
        self.train_docs = [d for d in docs if split_contents(d["contents"])[0].strip('"') in train]
        self.draws = 0
        self.redraw()

    def redraw(self) -> None:
        """A fresh set of invented people (new name pairs, new facts, new document layouts) and the index over
        them plus the train-side documents. Redrawn every pool when `--redraw`: facts that change cannot be
        memorised, so copying from the passage is the only way to lower the loss on them."""
        seed, self.draws = getattr(self.args, "seed", 0), self.draws + 1
        tag = f"{seed}" if self.draws == 1 else f"{seed}-{self.draws}"
        invented = invented_people(self.world, getattr(self.args, "invented", 0), random.Random(f"invented-{tag}"))
        doc_rng = random.Random(f"invented-docs-{tag}")
        docs = self.train_docs + [{"id": f"invented-{i}", "contents": document(p, doc_rng)}
                                  for i, p in enumerate(invented)]
        self.people = {**self.train_people, **{p.name: p for p in invented}}
        self.rows = self.train_rows + question_rows(invented)
        self.retriever = BM25Retriever(docs)
        self._cache: dict[tuple[str, int], tuple[str, str | None]] = {}

    def search(self, query: str, k: int) -> tuple[str, str | None]:
        """(observation text, name of the first passage's person) from the real search tool's output."""
        if (query, k) not in self._cache:
            hits = self.retriever.search([query], k)[0]
            top = split_contents(hits[0]["contents"])[0].strip('"') if hits else None
            self._cache[(query, k)] = (self.fmt.observation([ToolResult(format_passages(hits))]), top)
        return self._cache[(query, k)]

    def guess(self, relation: str, rng: random.Random) -> str:
        return rng.choice({"born": self.cities, "job": self.jobs, "teacher": self.train_names}[relation])

    def poor_query(self, name: str, rng: random.Random) -> str:
        first, last = name.split(" ")
        return rng.choice([first, last, rng.choice([n for n in self.train_names if n != name])])

    def sample(self, rng: random.Random, skill: bool = False) -> list[tuple[str, str]]:
        """[(kind, text)] with kind "prompt" | "model" | "obs"; the model's last piece is the answer.

        A `skill` episode always searches first and its first model token is kind "model*" (not in the
        loss): it teaches querying, reading and copying without moving the search-or-guess prior."""
        a = self.args
        row = rng.choice(self.rows)
        qtype, entity = row["metadata"]["type"], row["metadata"]["entity"]
        relation, hops = qtype.rstrip("2"), row["metadata"]["hops"]
        segs = [("prompt", row["prompt"])]
        if not skill and rng.random() >= a.p_search:
            return segs + [("model", f"<answer> {self.guess(relation, rng)} </answer>")]
        target, searches, top = entity, 0, None
        k = rng.choice(a.top_k)  # passages per search, drawn per episode: the model works with any of them
        final_target = entity if hops == 1 else self.people[entity].teacher
        while True:
            query = target if rng.random() < a.p_good_query else self.poor_query(target, rng)
            obs, top = self.search(query, k)
            first = skill and searches == 0
            segs += [("model*" if first else "model", f"<search> {query} </search>"), ("obs", obs)]
            searches += 1
            more = searches < a.max_searches
            if top == target and target != final_target and more and rng.random() < a.p_second:
                target = self.people[top].teacher  # the second hop: copy the teacher's name
                continue
            if top != target and more and rng.random() < a.p_retry:
                continue  # a poor query: try again
            break
        value = getattr(self.people[top], relation) if top is not None else self.guess(relation, rng)
        return segs + [("model", f"<answer> {value} </answer>")]


def encode_episode(segs, tok) -> tuple[list[int], list[int]]:
    """(ids, labels): each piece tokenized on its own (as the rollout loop splices them); loss on model pieces + </s>."""
    ids, labels = [], []
    for kind, text in segs:
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        if kind == "model*":  # the first token (the search-or-answer decision) stays out of the loss
            labels += [-100] + piece[1:]
        else:
            labels += piece if kind == "model" else [-100] * len(piece)
    ids.append(tok.eos_token_id)
    labels.append(tok.eos_token_id)
    return ids, labels


def _pad(rows: list[tuple[list[int], list[int]]], pad: int):
    L = max(len(r[0]) for r in rows)
    input_ids = torch.tensor([r[0] + [pad] * (L - len(r[0])) for r in rows])
    mask = torch.tensor([[1] * len(r[0]) + [0] * (L - len(r[0])) for r in rows])
    labels = torch.tensor([r[1] + [-100] * (L - len(r[1])) for r in rows])
    return input_ids, mask, labels


def batches(episodes: Episodes, tok, rng: random.Random, batch_size: int, pool: int = 16):
    """Endless right-padded batches; episodes of similar length go together (pools of `pool` batches,
    sorted by length, then shuffled), so a batch of one-line guesses is not padded to a two-hop episode."""
    first = True
    while True:
        share = episodes.args.skill_share
        if getattr(episodes.args, "redraw", False) and not first:
            episodes.redraw()
        first = False
        rows = sorted((encode_episode(episodes.sample(rng, skill=rng.random() < share), tok)
                       for _ in range(batch_size * pool)), key=lambda r: len(r[0]))
        chunks = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            yield _pad(chunk, tok.pad_token_id)


def quick_check(model, tok, rows: list[dict], args) -> str:
    """T=1 EM with and without the search tool, and searches per question, on a few held-out rows."""
    from tinyrl.agents.environments import build_agent
    from tinyrl.agents.probe import run_episodes, summarize
    from tinyrl.config.schema_agent import AgentConfig
    from tinyrl.tasks import get_task

    out = []
    for tools in (["search"], []):
        setup = build_agent(AgentConfig(enabled=True, tools=tools, top_k=args.eval_top_k), get_task("search_qa"))
        m = summarize(run_episodes(model, tok, rows, setup, n=4, max_new_tokens=args.max_new_tokens,
                                   max_obs_tokens=args.max_obs_tokens, seed=args.seed), 4)
        out.append(f"{'search' if tools else 'no tool'}: EM {m['em']:.3f} pass@4 {m['pass@4']:.2f} "
                   f"searches/q {m['searches']:.2f}")
    model.train()
    return "  |  ".join(out)


def pretrain(model, tok, episodes: Episodes, args, check_rows: list[dict] | None = None) -> float:
    rng = random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.98))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    model.train()
    t0, ema = time.time(), None
    stream = batches(episodes, tok, rng, args.batch_size)
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
        if check_rows and args.check_every and step % args.check_every == 0 and step < args.steps:
            t1 = time.time()
            print(f"    held-out check at step {step}: {quick_check(model, tok, check_rows, args)}", flush=True)
            t0 += time.time() - t1  # the check is not pretraining time
    return time.time() - t0


# --------------------------------------------------------------------------- evaluation


def held_out_rows(n: int) -> list[dict]:
    """The trainer's default held-out rows of the tiny preset (data.seed=0, num_eval=n, template plain)."""
    from tinyrl.tasks import get_task

    _, rows = get_task("search_qa").build(num_train=0, num_eval=n, seed=0, template=TEMPLATE)
    for r in rows:
        r["rendered"] = r["prompt"]
    return rows


def evaluate(model, tok, rows: list[dict], args) -> dict:
    """Probe on held-out rows with the search tool and with no tools at all."""
    from tinyrl.agents.environments import build_agent
    from tinyrl.agents.probe import probe
    from tinyrl.config.schema_agent import AgentConfig
    from tinyrl.tasks import get_task

    task = get_task("search_qa")
    out = {}
    for label, tools in (("search", ["search"]), ("no_tool", [])):
        setup = build_agent(AgentConfig(enabled=True, tools=tools, top_k=args.eval_top_k), task)
        t0 = time.time()
        out[label] = probe(model, tok, rows, setup, n=8, temperature=1.0, by="hops", max_turns=4,
                           max_new_tokens=args.max_new_tokens, max_obs_tokens=args.max_obs_tokens, seed=args.seed)
        out[label]["seconds"] = round(time.time() - t0, 1)
    return out


def report(m: dict, n: int) -> None:
    for label, r in m.items():
        g, s = r["greedy"], r["sampled"]
        print(f"held-out ({n} questions), tools={label}: greedy EM {g['em']:.3f} ({g['searches']:.2f} searches/q), "
              f"T=1 EM {s['em']:.3f}, pass@8 {s['pass@8']:.3f} ({s['searches']:.2f} searches/q, "
              f"{s['turns']:.2f} turns, tool errors {s['tool_error_rate']:.2f}), {r['seconds']}s")
        for hops, h in r.get("by_hops", {}).items():
            print(f"    {hops}-hop: greedy EM {h['greedy_em']:.3f}, T=1 EM {h['em']:.3f}, pass@8 {h['pass@8']:.3f}, "
                  f"searches/q {h['searches']:.2f}")


def save(model, tok, out: Path, info: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
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
    p.add_argument("--p-search", type=float, default=0.4, help="chance the first move is a search")
    p.add_argument("--p-good-query", type=float, default=0.8, help="chance a query is the entity's full name")
    p.add_argument("--p-retry", type=float, default=0.5, help="chance of searching again after a wrong document")
    p.add_argument("--p-second", type=float, default=0.4, help="chance of the second hop on a two-hop question")
    p.add_argument("--max-searches", type=int, default=3)
    p.add_argument("--invented", type=int, default=1000,
                   help="pretraining-only invented people (unused name pairs, random facts): reading, not memorising")
    p.add_argument("--redraw", action=argparse.BooleanOptionalAction, default=True,
                   help="draw new invented people (new facts) for every pool of batches, so none can be memorised")
    p.add_argument("--skill-share", type=float, default=0.5,
                   help="share of episodes that always search, their first decision kept out of the loss")
    p.add_argument("--top-k", type=int, nargs="+", default=[1, 2, 2],
                   help="passages per search (one drawn per episode)")
    p.add_argument("--eval-top-k", type=int, default=2, help="passages per search when measuring (tiny_search_cpu's)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--mlp-ratio", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared machine)")
    p.add_argument("--num-eval", type=int, default=60)
    p.add_argument("--max-new-tokens", type=int, default=320)
    p.add_argument("--max-obs-tokens", type=int, default=128)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--check-every", type=int, default=250, help="a quick held-out check every N steps (0: none)")
    p.add_argument("--no-save", action="store_true", help="train and evaluate only")
    p.add_argument("--eval-only", action="store_true", help="evaluate the model saved in --out (refreshes its info)")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    rows = held_out_rows(args.num_eval)
    if args.eval_only:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.out, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(args.out)
        metrics = evaluate(model, tok, rows, args)
        report(metrics, len(rows))
        info_path = args.out / "pretrain_info.json"
        if info_path.exists():
            info = json.loads(info_path.read_text())
            info["held_out"] = metrics
            info_path.write_text(json.dumps(info, indent=2) + "\n")
        return

    world, docs = read_world(WORLD), read_corpus(WORLD / "corpus.jsonl")
    from tinyrl.tasks import get_task

    train_rows, _ = get_task("search_qa").build(num_train=10**9, num_eval=0, seed=0, template=TEMPLATE)
    tok = make_tokenizer(vocabulary_texts(world, docs))
    tok.padding_side = "left"
    model = make_model(tok, args)
    n_params = sum(t.numel() for t in model.parameters())
    print(f"tiny-search: {n_params:,} parameters ({n_params * 4 / 1e6:.2f} MB float32), vocab {len(tok)}")
    episodes = Episodes(world, train_rows, docs, args)
    seconds = pretrain(model, tok, episodes, args, rows[:40])
    print(f"pretraining took {seconds:.0f}s on {args.threads} threads")
    metrics = evaluate(model, tok, rows, args)
    report(metrics, len(rows))
    if not args.no_save:
        tok.padding_side = "right"  # the saved default; tinyrl loads it with padding_side="left"
        info = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                         if k not in ("out", "no_save", "eval_only")},
                "parameters": n_params, "vocab": len(tok), "pretrain_seconds": round(seconds, 1),
                "held_out": metrics}
        save(model, tok, args.out, info)
        print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
