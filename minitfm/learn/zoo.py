"""The bug zoo (`minitfm learn bugs`): the whole book, working-looking, with one-line bugs planted.

Each `Bug` is one line of a chapter changed the way real projects get it wrong: a causal mask
that leaks the future, labels not shifted, AdamW without its bias correction... `write_zoo`
writes the seven chapters with every bug in place (they import, train and evaluate without a
crash) and a README that gives the learner each bug's symptom, numbered, never its place.

`check_zoo` says which bugs are fixed. Each bug's checker grades the zoo's function that holds
it alone, its global names the book's (as `learn check` grades an exercise), so the other bugs
cannot fool it; the two bugs in `attention` are told apart by what each changes: the scaling
shows in the weights whichever axis the softmax takes, the axis whatever the scaling.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch
from torch import Tensor, nn

from minitfm.book.metrics import LengthStats
from minitfm.book.model import Seq2SeqTransformer, sequence_loss
from minitfm.book.optim import AdamW
from minitfm.config import ModelConfig, TrainConfig
from minitfm.errors import from_signal
from minitfm.learn import checks
from minitfm.learn.checks import DTYPE, Subject, same, subject_from, time_limit
from minitfm.learn.checks.attention import cache_appends, qkv
from minitfm.learn.exercises import CHAPTERS
from minitfm.learn.workbook import (
    BOOK_IMPORT,
    Workbook,
    book_source,
    get_function,
    write_folder,
)
from minitfm.tasks.base import Batch

Checker = Callable[[Subject], bool]  # True: the bug is fixed (the zoo's function is right)


@dataclass(frozen=True)
class Bug:
    """One planted bug: the book's line, the zoo's, what a learner sees and what went wrong."""

    id: str
    chapter: str  # the book's file, without .py
    name: str  # the function or Class.method it sits in, named as the exercises name them
    line: str  # the book's text, found exactly once in its chapter (a test keeps it so)
    bugged: str  # what the zoo has in its place
    symptom: str  # what a learner can see, one sentence, never the place
    mistake: str  # the kind of mistake, said once it is fixed
    checker: Checker = field(repr=False, compare=False)  # True when the bug is fixed

    @property
    def file(self) -> str:
        return f"{self.chapter}.py"


# --- what each checker runs: small float64 models and inputs, the book around the function ---

PAD = 0  # the id of PAD in the checkers' toy vocabulary: PAD, BOS, EOS, then symbols 3..7


def toy_model(owner: type) -> Seq2SeqTransformer:
    """A tiny float64 model of class `owner` (the book's, with one method the zoo's), eval mode."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=2,
                      max_len=16)
    return owner(cfg, 8, PAD).to(DTYPE).eval()


def padded_sources() -> Tensor:
    return torch.tensor([[3, 4, 5, 6, 7], [5, 3, 4, PAD, PAD]])  # (B, S), the second padded


# --- the checkers, one per bug ---

def causal(s: Subject) -> bool:
    """Position i sees positions 0..i and nothing after."""
    return all(torch.equal(s(n), torch.ones(n, n, dtype=torch.bool).tril()) for n in (1, 4, 7))


def padding_masked(s: Subject) -> bool:
    """Encoding a padded batch gives the book's memory and source mask."""
    model = toy_model(s.owner())
    src = padded_sources()
    with torch.no_grad():
        memory, mask, _ = model.encode(src)
        book_memory, book_mask, _ = Seq2SeqTransformer.encode(model, src)
    return torch.equal(mask, book_mask) and same(memory, book_memory)


def attention_weights(s: Subject) -> tuple[Tensor, Tensor, Tensor]:
    """The zoo's weights on queries (2, 3, 5, 4) and keys (2, 3, 6, 4), with the scores scaled
    and not."""
    q, k, v = (t.detach() for t in qkv())
    _, weights = s(q, k, v)
    plain = q @ k.transpose(-2, -1)  # (B, H, T_q, T_k)
    return weights, plain / math.sqrt(q.size(-1)), plain


def any_of(weights: Tensor, *candidates: Tensor) -> bool:
    return any(same(weights, candidate) for candidate in candidates)


def scaled(s: Subject) -> bool:
    """The weights are those of the scaled scores, over either axis (that is the other bug)."""
    weights, right, _ = attention_weights(s)
    return any_of(weights, right.softmax(dim=-1), right.softmax(dim=-2))


def over_keys(s: Subject) -> bool:
    """The softmax runs over the keys, however the scores are scaled (that is the other bug):
    each query's weights sum to one and keep the order of its scores."""
    weights, _, plain = attention_weights(s)
    rows = torch.allclose(weights.sum(dim=-1), torch.ones_like(weights[..., 0]), atol=1e-6)
    return rows and bool((weights.argsort(dim=-1) == plain.argsort(dim=-1)).all())


def cache_returns_all(s: Subject) -> bool:
    """Every key and value so far, this step's included: chapter 1's check of the cache."""
    cache_appends(s)  # raises a Mismatch when not
    return True


def cached_positions(s: Subject) -> bool:
    """Decoding step by step with a cache gives the logits of one pass, and those the book's."""
    model = toy_model(s.owner())
    tgt = torch.tensor([[1, 3, 4, 5, 6], [1, 7, 6, 5, 4]])  # (B, T), BOS first
    with torch.no_grad():
        memory, src_mask, _ = model.encode(padded_sources())
        whole, _, _ = model.decode(tgt, memory, src_mask)
        book, _, _ = Seq2SeqTransformer.decode(model, tgt, memory, src_mask)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t:t + 1], memory, src_mask, cache)[0]
                 for t in range(tgt.size(1))]
    return same(whole, book) and same(torch.cat(steps, dim=1), whole)


class StillOptimizer:
    """An optimizer that moves nothing: `train_step` graded without training anything."""

    lr = 0.0

    def zero_grad(self) -> None:
        pass

    def step(self, max_norm: float | None = None) -> Tensor:
        return torch.zeros(())


def shifted_labels(s: Subject) -> bool:
    """The loss of a step is taken against the targets (tgt_out), not the decoder's input."""
    batch = Batch(torch.tensor([[3, 4], [5, PAD]]), torch.tensor([[1, 4, 3], [1, 5, PAD]]),
                  torch.tensor([[4, 3, 2], [5, 2, PAD]]), 5)
    logits = torch.randn(2, 3, 8, dtype=DTYPE, generator=torch.Generator().manual_seed(0))
    logits.requires_grad_()

    def model(src: Tensor, tgt: Tensor) -> Tensor:
        return logits  # (B, T, V), whatever it is fed

    cfg = SimpleNamespace(train=TrainConfig())
    state = SimpleNamespace(cfg=cfg, task=SimpleNamespace(vocab=SimpleNamespace(pad_id=PAD)),
                            model=model, model_or_wrapper=model, optimizer=StillOptimizer(),
                            step=0)
    loss, _ = s(state, batch)
    return same(loss, sequence_loss(logits, batch.tgt_out, PAD).detach(), atol=1e-6)


def rescaled(s: Subject) -> bool:
    """The kept values are 1 / (1 - p), the rest 0, about 1 - p of them kept: mean 1."""
    dropout = s.owner()(0.5).train()
    z = dropout.scale((20_000,), torch.zeros((), dtype=DTYPE))
    kept = z != 0
    return z.dtype == DTYPE and bool((z[kept] == 2.0).all()) and abs(z.mean().item() - 1) < 0.05


def off_in_eval(s: Subject) -> bool:
    """Dropout is active in training with p > 0 only: never in eval mode, never with p = 0."""
    owner = s.owner()
    x = torch.ones(4, 5, dtype=DTYPE)
    on, off = owner(0.5).train(), owner(0.5).eval()
    return on.active and not off.active and not owner(0.0).train().active and \
        torch.equal(off(x), x)


def bias_corrected(s: Subject) -> bool:
    """Three steps of the zoo's AdamW move a layer as the book's do."""
    moved = []
    for optimizer in (s.owner(), AdamW):
        torch.manual_seed(0)
        layer = nn.Linear(3, 2).to(DTYPE)
        adam = optimizer(layer, lr=0.1, weight_decay=0.01)
        x = torch.randn(4, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(1))
        for _ in range(3):
            adam.zero_grad()
            layer(x).square().sum().backward()
            adam.step(1.0)
        moved.append(adam.flat.clone())
    return same(*moved)


def whole_sequence(s: Subject) -> bool:
    """Exact match counts equal sequences only: a prefix, or a sequence too long, is wrong."""
    pairs = [([5, 6, 7], [5, 6, 7]), ([5, 6], [5, 6, 7]), ([5, 6, 7, 8], [5, 6, 7]),
             ([], [5]), ([6, 5], [5, 6])]
    zoo, book = s.owner()(), LengthStats()
    for pred, target in pairs:
        zoo.add(pred, target)
        book.add(pred, target)
    return vars(zoo) == vars(book)


BUGS = (
    Bug("labels-not-shifted", "loop", "train_step",
        "loss = sequence_loss(logits, batch.tgt_out,",
        "loss = sequence_loss(logits, batch.tgt_in,",
        "The training loss drops almost to zero within a few dozen steps while the evaluation "
        "loss climbs, and every answer comes out empty (the model writes the start token over "
        "and over, which prints as nothing).",
        "labels not shifted: the loss compared each position's prediction with the token fed "
        "in at that same position (tgt_in) instead of the next one (tgt_out), so the model "
        "learned to copy its input, which teacher forcing rewards and decoding cannot use.",
        shifted_labels),
    Bug("no-scaling", "attention", "attention",
        "scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)",
        "scores = q @ k.transpose(-2, -1)",
        "Before any training, the attention maps are already sharp: at step 0 a row's heaviest "
        "key gets about twice the weight a correct model gives it.",
        "the scaling missing: q·k sums d_k products, so its spread grows like sqrt(d_k); "
        "dividing by sqrt(d_k) keeps the softmax out of its saturated, one-hot corner, where "
        "gradients vanish (Vaswani et al. 2017, §3.2.1).", scaled),
    Bug("exact-match-prefix", "metrics", "LengthStats.add",
        "self.exact += pred == target",
        "self.exact += all(p == t for p, t in zip(pred, target))",
        "Exact match runs ahead of token accuracy early in training, far above a correct "
        "count's, and an answer cut short or running past its target counts as right.",
        "exact match that counts a prefix: zip stops at the shorter sequence, so comparing "
        "position by position never sees the missing or extra tokens; compare the whole "
        "sequences (pred == target), lengths included.", whole_sequence),
    Bug("causal-mask-leak", "model", "subsequent_mask",
        "return torch.ones(size, size, dtype=torch.bool, device=device).tril()",
        "return torch.ones(size, size, dtype=torch.bool, device=device).tril(1)",
        "The training and evaluation losses fall far lower than a correct model's, yet exact "
        "match stays near zero: the model is right only when it is shown the answer.",
        "a causal mask that leaks the future: tril(1) keeps one diagonal too many, so each "
        "position sees the very token it must predict; teacher forcing then rewards copying "
        "it, which free-running decoding, with no future to see, cannot do.", causal),
    Bug("dropout-not-rescaled", "layers", "Dropout.scale",
        "return uniform.ge_(self.p).div_(1.0 - self.p)",
        "return uniform.ge_(self.p)",
        "With model.dropout set, dropout in training shrinks what it passes on average (ones "
        "come out with mean 1 - p, not 1), so evaluation meets larger activations than "
        "training did.",
        "dropout not rescaled: zeroing with probability p leaves a mean of (1 - p) x; inverted "
        "dropout divides the kept values by 1 - p, so that evaluation, with no dropout, sees "
        "activations of the size training did (Srivastava et al. 2014).", rescaled),
    Bug("kv-cache-off-by-one", "attention", "KVCache.append",
        "return self.k, self.v",
        "return keys[:, :, :start], values[:, :, :start]",
        "Answers decoded with the KV cache are empty or garbled, while decoding without the "
        "cache gets them right and the loss is a correct model's.",
        "a KV cache off by one: append returned the keys and values cached before this step, "
        "so a new token never attended to itself (and the first to nothing); return all of "
        "them, this step's included.", cache_returns_all),
    Bug("dropout-on-in-eval", "layers", "Dropout.active",
        "return self.training and self.p > 0.0",
        "return self.p > 0.0",
        "With model.dropout set, the evaluation loss stays as high as the training loss (a "
        "correct model's falls well below it), and one input decoded twice gets two answers.",
        "dropout left on at evaluation: model.eval() only switches the training flag, and a "
        "dropout that ignores it keeps dropping at test time; evaluation must be "
        "deterministic.", off_in_eval),
    Bug("softmax-axis", "attention", "attention",
        "weights = scores.softmax(dim=-1)",
        "weights = scores.softmax(dim=-2)",
        "In the attention pictures each column sums to one instead of each row: a query's "
        "weights are no distribution over the keys.",
        "softmax over the wrong axis: dim=-2 normalises over the queries, so each key's "
        "column sums to one and a query's weights mix in the later queries' scores; the "
        "softmax runs over the keys, the last dim.", over_keys),
    Bug("positions-off-by-one", "model", "Seq2SeqTransformer.decode",
        "offset = cache[0].self_attn.length if cache is not None else 0",
        "offset = cache[0].self_attn.length + 1 if cache is not None else 0",
        "Answers decoded with the KV cache often come out a token short, one skipped as if "
        "written already, while decoding without the cache gets them right.",
        "positions off by one: with a cache, the new token's position is the number of tokens "
        "cached (0 for the first), not one more; a model trained on positions 0..T-1 reads "
        "the shifted ones as later places in the answer.", cached_positions),
    Bug("adamw-no-bias-correction", "optim", "AdamW.step",
        "correction1, correction2 = 1 - beta1**self.t, 1 - beta2**self.t",
        "correction1, correction2 = 1.0, 1.0",
        "Step for step against torch.optim.AdamW from the same weights and gradients, the "
        "updates are 0.7 times as large at the first step and about 1.5 times from the tenth "
        "to the twentieth, agreeing only after a couple of hundred steps.",
        "AdamW without bias correction: m and v start at zero, so their running means are too "
        "small early on (by 1 - β^t); dividing by 1 - β1^t and 1 - β2^t corrects them "
        "(Kingma & Ba 2015, §3).", bias_corrected),
    Bug("padding-mask-ignored", "model", "Seq2SeqTransformer.encode",
        "scope = AttentionScope(src_mask, self.encoder_positions(src, positions))",
        "scope = AttentionScope(None, self.encoder_positions(src, positions))",
        "A short input decoded on its own gets another answer, often a wrong one, than in a "
        "batch beside longer inputs (padded to their length).",
        "a padding mask ignored: the encoder's self-attention let real tokens attend to the "
        "PAD tokens after them, so what a source means depended on how much padding its batch "
        "gave it; pass the source mask to every attention over the source.", padding_masked),
)


# --- writing the zoo ---

def zoo_chapter(chapter: str) -> str:
    """A chapter with its bugs planted and its book imports made relative."""
    source = BOOK_IMPORT.sub(r"from .\1 import", book_source(chapter))
    for bug in BUGS:
        if bug.chapter != chapter:
            continue
        if source.count(bug.line) != 1:  # the book changed: the zoo must follow it
            raise RuntimeError(f"the bug {bug.id} plants itself at {bug.line!r}, which "
                               f"minitfm/book/{bug.file} has {source.count(bug.line)} times")
        source = source.replace(bug.line, bug.bugged)
    return source


def readme(folder: Path) -> str:
    """The zoo's README: how to work through it, and the symptoms, numbered."""
    symptoms = "\n".join(f"{n}. {bug.symptom}" for n, bug in enumerate(BUGS, 1))
    return f"""# The bug zoo

This folder is the whole minitfm book, its seven chapters, with {len(BUGS)} bugs planted: each
a single line changed the way real projects get it wrong. It imports, trains and evaluates
without a crash; it is just wrong, quietly, as real bugs are. You get what each bug does, not
where it is.

Train it and look: `minitfm train --book {folder}` (or `model.code={folder}`) runs this code;
set `model.dropout=0.3` for the symptoms that need dropout. Some symptoms compare greedy
decoding with the KV cache and without it: greedy decoding's `use_cache`, from Python. Read the
chapters as a reviewer would, test your guesses, and fix each bug with a one-line change.

`minitfm learn check {folder}` says how many are fixed; each checker accepts the right line and
nothing else, and names the mistake once you have fixed it. Comparing with minitfm/book/ line
by line gives the answers away: try the symptoms first.

## The symptoms

{symptoms}
"""


def write_zoo(folder: str | Path) -> list[Path]:
    """The book's chapters with every bug planted, a README and the mark, in a new folder."""
    folder = Path(folder)
    files = {f"{chapter}.py": zoo_chapter(chapter) for chapter in CHAPTERS}
    files["__init__.py"] = ('"""The minitfm bug zoo (minitfm learn bugs): the book, with bugs '
                            'planted."""\n')
    files["README.md"] = readme(folder)
    write_folder(folder, files, "zoo", "bugs")
    return [folder / f"{chapter}.py" for chapter in CHAPTERS]


# --- checking it ---

def zoo_subject(bug: Bug, module: ModuleType) -> Subject:
    """The function holding `bug`, from `module`, graded alone: its global names the book's.
    The bug stands for the exercise (a `Subject` reads its chapter and name); a property
    (Dropout.active) is graded by its getter."""
    found = get_function(module, bug.name)
    if isinstance(found, property):
        return Subject(bug, property(subject_from(bug, found.fget, module).function))
    return subject_from(bug, found, module)


def is_fixed(bug: Bug, module: ModuleType) -> bool:
    """Whether `module`'s version of the function holding `bug` is right (an error, or running
    past the checks' time limit: not)."""
    try:
        with time_limit(checks.TIME_LIMIT_S), torch.random.fork_rng():
            torch.manual_seed(0)
            return bool(bug.checker(zoo_subject(bug, module)))
    except BaseException as err:  # the learner's code, a Mismatch, the time limit: "not fixed"
        if from_signal(err):
            raise
        return False


def check_modules(modules: dict[str, ModuleType]) -> list[tuple[Bug, bool]]:
    """Each bug, and whether the chapters `modules` (by chapter name) have it fixed."""
    return [(bug, is_fixed(bug, modules[bug.chapter])) for bug in BUGS]


def check_zoo(workbook: Workbook) -> list[tuple[Bug, bool]]:
    """Each bug of the zoo, in the README's order, and whether it is fixed."""
    return check_modules(workbook.modules)


def check_book() -> list[tuple[Bug, bool]]:
    """The checkers on the book itself: every bug fixed (a test keeps it so)."""
    return check_modules({c: importlib.import_module(f"minitfm.book.{c}") for c in CHAPTERS})
