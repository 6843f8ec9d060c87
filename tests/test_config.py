"""Configuration: defaults, immutability, layering defaults < file < env < overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tinycontext import ConfigError, TinyContextConfig, load_config
from tinycontext.config import CONFIG_PATH_ENV, default_db_path


@pytest.fixture
def no_user_config(tmp_path, monkeypatch):
    """Point the per-user config dir at an empty folder so a developer's own file never leaks in."""
    monkeypatch.setattr("tinycontext.config.default_config_file", lambda: tmp_path / "absent" / "context_config.json")


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def test_defaults():
    cfg = TinyContextConfig()
    assert cfg.embedding_model == "fast"
    assert cfg.recall_top_k == 10 and cfg.recall_max_tokens == 2000
    assert cfg.encoding_name == "o200k_base"
    assert cfg.dedup_mode == "report" and cfg.reindex == "error"
    assert cfg.memory_db_path == default_db_path()
    assert cfg.memory_db_path.is_absolute()


def test_frozen_and_hashable():
    cfg = TinyContextConfig()
    with pytest.raises(ValidationError):
        cfg.recall_top_k = 3
    assert hash(cfg) == hash(TinyContextConfig())
    assert {cfg: 1}[TinyContextConfig()] == 1


def test_unknown_keys_rejected():
    with pytest.raises(ValidationError, match="recal_top_k"):
        TinyContextConfig(recal_top_k=3)


def test_out_of_range_rejected():
    with pytest.raises(ValidationError):
        TinyContextConfig(recall_top_k=0)
    with pytest.raises(ValidationError):
        TinyContextConfig(dedup_mode="drop")


def test_tilde_paths_expand():
    cfg = TinyContextConfig(memory_db_path="~/x.db")
    assert cfg.memory_db_path == Path.home() / "x.db"


def test_constructor_reads_no_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYCONTEXT_RECALL_TOP_K", "7")
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(tmp_path / "env.db"))
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "nope.json"))
    cfg = TinyContextConfig()
    assert cfg.recall_top_k == 10
    assert cfg.memory_db_path == default_db_path()


def test_load_config_without_file_or_env_is_defaults(no_user_config):
    assert load_config(env={}) == TinyContextConfig()


def test_layering_file_then_env_then_overrides(tmp_path, no_user_config):
    file = write(tmp_path / "cfg.json", {"recall_top_k": 3, "recall_max_tokens": 500, "dedup_mode": "skip"})
    cfg = load_config(file, env={"TINYCONTEXT_RECALL_TOP_K": "4"})
    assert (cfg.recall_top_k, cfg.recall_max_tokens, cfg.dedup_mode) == (4, 500, "skip")
    cfg = load_config(file, env={"TINYCONTEXT_RECALL_TOP_K": "4"}, recall_top_k=5)
    assert cfg.recall_top_k == 5


def test_config_path_from_env(tmp_path, no_user_config):
    file = write(tmp_path / "cfg.json", {"recall_top_k": 3})
    assert load_config(env={CONFIG_PATH_ENV: str(file)}).recall_top_k == 3


def test_user_config_file_used_when_present(tmp_path, monkeypatch):
    file = write(tmp_path / "context_config.json", {"recall_top_k": 6})
    monkeypatch.setattr("tinycontext.config.default_config_file", lambda: file)
    assert load_config(env={}).recall_top_k == 6


def test_relative_paths_resolve_against_the_file(tmp_path, no_user_config, monkeypatch):
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "bundle").mkdir()
    file = write(folder / "cfg.json", {"memory_db_path": "data/mem.db", "models_dir": "../models",
                                       "embedding_model": "./bundle"})
    monkeypatch.chdir(tmp_path)  # must not matter
    cfg = load_config(file, env={})
    assert cfg.memory_db_path == (folder / "data" / "mem.db").resolve()
    assert cfg.models_dir == (tmp_path / "models").resolve()
    assert cfg.embedding_model == str((folder / "bundle").resolve())


def test_absolute_paths_and_model_names_kept(tmp_path, no_user_config):
    file = write(tmp_path / "cfg.json", {"memory_db_path": str(tmp_path / "abs.db"), "embedding_model": "balanced"})
    cfg = load_config(file, env={})
    assert cfg.memory_db_path == tmp_path / "abs.db"
    assert cfg.embedding_model == "balanced"


def test_env_json_and_scalars(tmp_path, no_user_config):
    cfg = load_config(env={"TINYCONTEXT_RECALL_DENSE_WEIGHT": "0.25", "TINYCONTEXT_MAX_BATCH_SIZE": " 12 ",
                           "TINYCONTEXT_DENSE_QUERY_PREFIX": "", "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "e.db")})
    assert cfg.recall_dense_weight == 0.25
    assert cfg.max_batch_size == 12
    assert cfg.dense_query_prefix == ""
    assert cfg.memory_db_path == tmp_path / "e.db"


@pytest.mark.parametrize("content", ["{not json", '{"recall_top_k": }', "[1, 2]", '"text"', b"\xff\xfe{}"])
def test_bad_file_is_config_error(tmp_path, no_user_config, content):
    file = tmp_path / "cfg.json"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as err:
        load_config(file, env={})
    assert str(file) in err.value.message


def test_bad_values_are_config_error(tmp_path, no_user_config):
    with pytest.raises(ConfigError, match="recall_top_k"):
        load_config(write(tmp_path / "cfg.json", {"recall_top_k": "many"}), env={})
    with pytest.raises(ConfigError, match="no_such_key"):
        load_config(write(tmp_path / "cfg2.json", {"no_such_key": 1}), env={})
    with pytest.raises(ConfigError):
        load_config(env={"TINYCONTEXT_RECALL_TOP_K": "-1"})
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(env={"TINYCONTEXT_RECALL_TOP_K": "{oops"})


def test_missing_explicit_file_is_config_error(tmp_path, no_user_config):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.json", env={})
    with pytest.raises(ConfigError, match=CONFIG_PATH_ENV):
        load_config(env={CONFIG_PATH_ENV: str(tmp_path / "missing.json")})


def test_config_error_code():
    err = ConfigError("x")
    assert err.code == "config_error" and err.to_dict()["code"] == "config_error"
