"""``fairlane hash-key`` prints the stored form of a key under the salt of a config or of the environment."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fairlane.cli import app
from tenancy import DEMO_KEY_SALT, DEMO_KEYS, hash_api_key
from tenancy.loader import DEFAULT_CONFIG_PATH

runner = CliRunner()


def test_hash_from_config_matches_the_stored_demo_hash() -> None:
    result = runner.invoke(app, ["hash-key", "--config", str(DEFAULT_CONFIG_PATH)], input="sk-fairlane-bob\n")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == hash_api_key(DEMO_KEYS["bob"], DEMO_KEY_SALT)
    assert result.output.strip() in DEFAULT_CONFIG_PATH.read_text()


def test_hash_from_environment_and_option() -> None:
    env = {"MY_SALT": "salt-from-the-environment"}
    result = runner.invoke(app, ["hash-key", "--salt-env", "MY_SALT", "--key", "sk-x"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == hash_api_key("sk-x", "salt-from-the-environment")


def test_missing_or_short_salt_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["hash-key", "--salt-env", "NO_SUCH_VAR_42", "--key", "k"], env={})
    assert result.exit_code == 2 and "NO_SUCH_VAR_42" in result.output
    config = tmp_path / "t.yaml"
    config.write_text("key_salt: short\n")
    result = runner.invoke(app, ["hash-key", "--config", str(config), "--key", "k"])
    assert result.exit_code == 2 and "at least 16" in result.output
