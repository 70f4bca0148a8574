"""Loading the tenancy config from YAML, and the embedded default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tenancy.config import TenancyConfig
from tenancy.errors import KeySaltError, TenancyConfigError
from tenancy.keys import check_salt

DEFAULT_CONFIG_PATH = Path(__file__).with_name("default_tenants.yaml")

#: Public demo keys of the embedded default config (their hashes are in default_tenants.yaml).
DEMO_KEYS: Mapping[str, str] = {
    "alice": "sk-fairlane-alice",
    "bob": "sk-fairlane-bob",
    "carol": "sk-fairlane-carol",
}
DEMO_ADMIN_KEY = "sk-fairlane-admin"
#: The PUBLIC salt of the embedded demo config (``key_salt`` in default_tenants.yaml): demo only.
DEMO_KEY_SALT = "fairlane-demo-salt-PUBLIC-not-for-production"


class _StrictLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_tenancy_config(data: object, source: str = "<data>") -> TenancyConfig:
    """Validate already-parsed data (a mapping) into a ``TenancyConfig``."""
    if not isinstance(data, Mapping):
        raise TenancyConfigError(f"{source}: the tenancy config must be a mapping, got {type(data).__name__}")
    try:
        return TenancyConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise TenancyConfigError(f"{source}: invalid tenancy config", _problems(exc)) from None


def read_tenancy_text(path: str | Path) -> str:
    """The text of a tenancy YAML file; ``TenancyConfigError`` when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TenancyConfigError(f"{path}: cannot read tenancy config ({exc.strerror})") from None


def _parse_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise TenancyConfigError(f"{source}: invalid YAML: {exc}") from None


def _read_yaml(path: Path) -> object:
    return _parse_yaml(read_tenancy_text(path), str(path))


def parse_tenancy_text(text: str, source: str = "<text>") -> TenancyConfig:
    """Validate the text of a YAML tenancy config (a file's, or one another router published)."""
    return parse_tenancy_config(_parse_yaml(text, source), source)


def load_tenancy_config(path: str | Path) -> TenancyConfig:
    """Read and validate a YAML tenancy config; every problem raises ``TenancyConfigError``."""
    path = Path(path)
    return parse_tenancy_config(_read_yaml(path), str(path))


def read_key_salt(path: str | Path) -> str:
    """Only the ``key_salt`` of a tenancy YAML, without validating the rest.

    ``fairlane hash-key`` reads it while a config is being migrated, when its hashes are still the
    old form and the whole file would not validate.
    """
    path = Path(path)
    data = _read_yaml(path)
    salt = data.get("key_salt") if isinstance(data, Mapping) else None
    if not isinstance(salt, str):
        raise TenancyConfigError(f"{path}: no key_salt (a string of at least 16 characters) in the file")
    try:
        return check_salt(salt)
    except KeySaltError as exc:
        raise TenancyConfigError(f"{path}: {exc}") from None


def key_salt_from(config: str | Path | None, env_var: str) -> str:
    """The salt of ``config`` (a tenancy YAML) when given, else of the environment variable ``env_var``."""
    if config is not None:
        return read_key_salt(config)
    value = os.environ.get(env_var)
    if not value:
        raise TenancyConfigError(f"no key salt: give a tenancy config with key_salt, or set {env_var}")
    try:
        return check_salt(value)
    except KeySaltError as exc:
        raise TenancyConfigError(f"{env_var}: {exc}") from None


def default_tenancy_config() -> TenancyConfig:
    """The embedded demo config: tenants alice, bob, carol; classes interactive, standard, batch."""
    return load_tenancy_config(DEFAULT_CONFIG_PATH)


def _problems(exc: ValidationError) -> tuple[str, ...]:
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        msg = err["msg"].removeprefix("Value error, ")
        loc = ".".join(str(p) for p in err["loc"])
        lines.append(f"{loc}: {msg}" if loc else msg)
    return tuple(lines)
