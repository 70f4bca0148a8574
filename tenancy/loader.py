"""Loading the tenancy config from YAML, and the embedded default."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tenancy.config import TenancyConfig
from tenancy.errors import TenancyConfigError

DEFAULT_CONFIG_PATH = Path(__file__).with_name("default_tenants.yaml")

#: Public demo keys of the embedded default config (their hashes are in default_tenants.yaml).
DEMO_KEYS: Mapping[str, str] = {
    "alice": "sk-fairlane-alice",
    "bob": "sk-fairlane-bob",
    "carol": "sk-fairlane-carol",
}
DEMO_ADMIN_KEY = "sk-fairlane-admin"


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


def load_tenancy_config(path: str | Path) -> TenancyConfig:
    """Read and validate a YAML tenancy config; every problem raises ``TenancyConfigError``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TenancyConfigError(f"{path}: cannot read tenancy config ({exc.strerror})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise TenancyConfigError(f"{path}: invalid YAML: {exc}") from None
    return parse_tenancy_config(data, str(path))


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
