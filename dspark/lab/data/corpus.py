"""The offline corpus: three domains built from what a fresh Python install has.

The paper evaluates on math, code and chat. We mirror those domains without
downloading anything:

  * code: function definitions from the running interpreter's standard library
    (test packages skipped), files in sorted order, bodies de-duplicated. The
    prompt is the signature plus docstring, the response is the body.
  * math: seeded grade-school word problems with step-by-step solutions
    (`dspark.lab.data.math_problems`).
  * chat: English prose from the standard library's docstrings and pydoc's
    topic texts, shaped into user questions and assistant answers.

Every sample is a (prompt, response) pair; `Tokenizer.chat_sample` adds the
special tokens. Splits are decided by a stable hash of each sample's *source*
(e.g. `json.decoder:JSONDecoder.decode`), so the code sample and the chat
sample made from the same function always land in the same split. Per domain,
the `EVAL_PER_DOMAIN` samples with the smallest hashes become the held-out
evaluation prompts (never trained on); about 2% more form the validation split.

What this file does not do: tokenise (see `build_token_arrays`) or train. The
stdlib differs between Python versions, so the manifest records the version and
a content hash of the corpus.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dspark.checkpoint import ASSETS_DIR
from dspark.lab import storage
from dspark.lab.data.math_problems import generate_problems
from dspark.tokenizer import Tokenizer

DOMAINS = ("code", "math", "chat")
EVAL_PROMPTS_PATH = ASSETS_DIR / "eval_prompts.jsonl"  # the held-out prompts, shipped
CORPUS_MANIFEST_PATH = ASSETS_DIR / "corpus_manifest.json"  # sizes + hash of the corpus behind them
MATH_PROBLEMS = 15000  # generated math problems in the default corpus
EVAL_PER_DOMAIN = 80  # held-out prompts per domain (at least 64, so per-domain numbers are not noise)
VAL_FRACTION = 0.02
MAX_PROMPT_CHARS = 1500
MAX_RESPONSE_CHARS = 2000
MAX_EVAL_PROMPT_CHARS = 700  # leaves room to generate inside a 512-token context
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "dist-packages"}


@dataclass
class Sample:
    domain: str  # "code" | "math" | "chat"
    source: str  # where it came from; also the key that decides the split
    prompt: str
    response: str
    split: str = ""  # "train" | "val" | "eval", filled in by assign_splits


def stable_hash(key: str) -> int:
    """A 64-bit hash that, unlike hash(), is the same in every process."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


# ---------------------------------------------------------------------------
# code and chat, from the standard library
# ---------------------------------------------------------------------------
def stdlib_files() -> list[tuple[str, Path]]:
    """(module name, path) of every stdlib .py file outside test packages, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts) or rel.name.startswith("test_"):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        files.append((module, path))
    return files


def _walk_defs(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Yield (qualified name, node) for classes and functions, methods included."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop(0)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                if isinstance(child, ast.ClassDef):
                    stack.append((name + ".", child))


def _dedent(lines: list[str]) -> list[str]:
    indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
    cut = min(indents, default=0)
    return [x[cut:] if x.strip() else "\n" for x in lines]


def code_and_docstring_samples() -> Iterator[Sample]:
    """Function-completion samples (code) and docstring Q&A samples (chat)."""
    for module, path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        doc = ast.get_docstring(tree)
        if doc and len(doc) >= 80:
            yield _chat_from_docstring(module, module, doc, kind="module")
        for qualname, node in _walk_defs(tree):
            source = f"{module}:{qualname}"
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 80:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                yield _chat_from_docstring(module, qualname, doc, kind=kind, source=source)
            if isinstance(node, ast.ClassDef):
                continue
            first_body = node.body[1] if doc and len(node.body) > 1 else node.body[0]
            if doc and len(node.body) == 1:
                continue  # a docstring and nothing else
            split_at = first_body.lineno - 1 - len(getattr(first_body, "decorator_list", []))
            start = node.lineno - 1 - len(node.decorator_list)
            seg = _dedent(lines[start : node.end_lineno])
            head, body = seg[: split_at - start], seg[split_at - start :]
            header, response = "".join(head), "".join(body).rstrip() + "\n"
            if (
                not head
                or len(body) < 2
                or len(header) > MAX_PROMPT_CHARS
                or len(response) > MAX_RESPONSE_CHARS
            ):
                continue
            owner = f" (a method of `{qualname.rsplit('.', 1)[0]}`)" if "." in qualname else ""
            prompt = f"Complete this function from the Python module `{module}`{owner}:\n\n{header}"
            yield Sample("code", source, prompt, response)


_DOC_QUESTIONS = {
    "function": (
        "What does `{name}` do in Python's `{module}` module?",
        "Explain `{module}.{name}` to me.",
        "How is `{name}` from `{module}` used?",
        "I'm reading the `{module}` module. What is `{name}` for?",
    ),
    "class": (
        "What is the `{name}` class in `{module}`?",
        "Describe the class `{module}.{name}`.",
        "When would I use `{name}` from the `{module}` module?",
    ),
    "module": (
        "What is the Python module `{module}` for?",
        "Give me an overview of the `{module}` module.",
    ),
}


def _clip_paragraphs(text: str, limit: int) -> str:
    out = ""
    for para in text.split("\n\n"):
        candidate = f"{out}\n\n{para}" if out else para
        if len(candidate) > limit:
            break
        out = candidate
    return out or text[:limit]


def _chat_from_docstring(module: str, name: str, doc: str, kind: str, source: str = "") -> Sample:
    source = source or f"{module}:"
    questions = _DOC_QUESTIONS[kind]
    question = questions[stable_hash(source + "#q") % len(questions)]
    prompt = question.format(name=name, module=module)
    return Sample("chat", source, prompt, _clip_paragraphs(doc.strip(), MAX_RESPONSE_CHARS))


def pydoc_topic_samples() -> Iterator[Sample]:
    """pydoc's language-reference topics, cut into answer-sized parts."""
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        human = topic.replace("-", " ")
        rest = topics[topic].strip()
        part = 1
        while rest:
            chunk = _clip_paragraphs(rest, 1200)
            rest = rest[len(chunk) :].strip()
            if part == 1:
                prompt = f"Explain {human} in Python."
            else:
                prompt = f"Tell me more about {human} in Python (part {part})."
            yield Sample("chat", f"pydoc:{topic}#{part}", prompt, chunk)
            part += 1


def math_samples(count: int, seed: int) -> Iterator[Sample]:
    for i, (question, solution) in enumerate(generate_problems(count, seed)):
        yield Sample("math", f"math:{seed}:{i}", question, solution)


# ---------------------------------------------------------------------------
# the corpus
# ---------------------------------------------------------------------------
def build_samples(math_count: int = MATH_PROBLEMS, seed: int = 0) -> list[Sample]:
    """All samples of all domains, de-duplicated, with splits assigned."""
    seen: set[str] = set()
    samples = []
    streams = (code_and_docstring_samples(), pydoc_topic_samples(), math_samples(math_count, seed))
    for stream in streams:
        for s in stream:
            key = hashlib.sha256(f"{s.domain}\0{s.prompt}\0{s.response}".encode()).hexdigest()
            body_key = hashlib.sha256(f"{s.domain}\0{s.response}".encode()).hexdigest()
            if key in seen or (s.domain == "code" and body_key in seen):
                continue
            seen.update((key, body_key))
            samples.append(s)
    assign_splits(samples)
    return samples


def assign_splits(samples: list[Sample]) -> None:
    """Eval = per domain the EVAL_PER_DOMAIN short prompts with the smallest source
    hashes; anything sharing a source with them is held out too; val ~ 2%."""
    eval_sources: set[str] = set()
    for domain in DOMAINS:
        pool = sorted(
            (stable_hash(s.source), s.source)
            for s in samples
            if s.domain == domain and len(s.prompt) <= MAX_EVAL_PROMPT_CHARS
        )
        eval_sources.update(src for _, src in pool[:EVAL_PER_DOMAIN])
    val_cut = int(VAL_FRACTION * 2**64)
    for s in samples:
        if s.source in eval_sources:
            s.split = "eval"
        elif stable_hash(s.source + "#val") < val_cut:
            s.split = "val"
        else:
            s.split = "train"


def eval_prompts(samples: list[Sample]) -> list[dict[str, str]]:
    """One record per held-out evaluation prompt, EVAL_PER_DOMAIN per domain."""
    out = []
    for domain in DOMAINS:
        chosen = [s for s in samples if s.split == "eval" and s.domain == domain]
        chosen = sorted(chosen, key=lambda s: stable_hash(s.source))[:EVAL_PER_DOMAIN]
        out += [{"domain": s.domain, "source": s.source, "prompt": s.prompt} for s in chosen]
    return out


def load_eval_prompts(path: str | Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def eval_prompts_by_domain(
    per_domain: int | None = None, path: str | Path | None = None
) -> dict[str, list[str]]:
    """The shipped held-out prompts grouped by domain (code, math, chat order), at most `per_domain` each."""
    out: dict[str, list[str]] = {}
    for r in load_eval_prompts(path or EVAL_PROMPTS_PATH):
        prompts = out.setdefault(r["domain"], [])
        if per_domain is None or len(prompts) < per_domain:
            prompts.append(r["prompt"])
    return out


def write_jsonl(records: list[dict], path: Path) -> None:
    """One JSON object per line, written whole or not at all (storage.write_text_atomic)."""
    storage.write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def corpus_manifest(samples: list[Sample], math_count: int, seed: int) -> dict:
    """Sizes per domain and split, and a content hash of the whole corpus."""
    digest = hashlib.sha256()
    for s in samples:
        digest.update(json.dumps(asdict(s), ensure_ascii=False).encode())
    counts = Counter((s.domain, s.split) for s in samples)
    chars = Counter()
    for s in samples:
        chars[s.domain] += len(s.prompt) + len(s.response)
    return {
        "python": sys.version.split()[0],
        "math_problems": math_count,
        "seed": seed,
        "sha256": digest.hexdigest(),
        "domains": {
            d: {
                "samples": {sp: counts[(d, sp)] for sp in ("train", "val", "eval")},
                "chars": chars[d],
            }
            for d in DOMAINS
        },
    }


def build_token_arrays(samples: list[Sample], tokenizer: Tokenizer, out_dir: Path) -> dict:
    """Write `{domain}.{split}.bin` (uint16 ids, samples back to back) for train
    and val; return the token count of each file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for domain in DOMAINS:
        for split in ("train", "val"):
            ids: list[int] = []
            for s in samples:
                if s.domain == domain and s.split == split:
                    ids += tokenizer.chat_sample(s.prompt, s.response)
            np.asarray(ids, dtype=np.uint16).tofile(out_dir / f"{domain}.{split}.bin")
            sizes[f"{domain}.{split}"] = len(ids)
    return sizes


def load_token_array(out_dir: Path, domain: str, split: str) -> np.ndarray:
    path = Path(out_dir) / f"{domain}.{split}.bin"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run `python -m dspark.train data` first")
    return np.fromfile(path, dtype=np.uint16)
