"""helm lint (Helm's own Go linter, through helm-python-sdk) and the chart's metadata and values file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import helm_python
import pytest
import yaml

from tests.helm.chart import CHART_DIR, CI_DIR, chart

WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error


def _problems(report: dict) -> list[str]:
    found = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= WARNING]
    return found + list(report["errors"])


@pytest.mark.parametrize("values_file", [None, *sorted(p.name for p in CI_DIR.glob("*-values.yaml"))])
def test_helm_lint_strict_is_clean(values_file: str | None) -> None:
    values = yaml.safe_load((CI_DIR / values_file).read_text()) if values_file else None
    report = helm_python.lint(CHART_DIR, values, strict=True, namespace="llm", kube_version="v1.30.0")
    assert report["total_charts_linted"] == 1
    assert _problems(report) == []


def test_helm_lint_catches_a_broken_template(tmp_path: Path) -> None:
    """The lint call really lints: a template with a syntax error is reported."""
    broken = tmp_path / "fairlane"
    shutil.copytree(CHART_DIR, broken)
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nname: {{ .Values.nope | \n")
    assert _problems(helm_python.lint(broken, strict=True))


def test_chart_metadata() -> None:
    meta = chart().metadata
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "fairlane"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    assert meta["appVersion"]
    assert meta["type"] == "application"


def test_ci_values_files_exist_for_every_option() -> None:
    names = {p.name for p in CI_DIR.glob("*-values.yaml")}
    assert {"all-options-values.yaml", "external-redis-values.yaml"} <= names


def _described_keys() -> list[tuple[int, str, bool]]:
    """(line number, dotted key, described) of every key of values.yaml outside list items.

    A key is described when a comment line sits right above it, or above one of its parent keys.
    """
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str, bool]] = []  # (indent, key, described)
    list_indent: int | None = None
    out = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if list_indent is not None and indent < list_indent:
            list_indent = None
        if stripped.startswith("- "):
            list_indent = indent if list_indent is None else min(list_indent, indent)
        if list_indent is not None and indent >= list_indent:
            continue
        match = re.match(r"([A-Za-z_][\w.-]*):", stripped)
        assert match, f"values.yaml:{number}: unexpected line {line!r}"
        while stack and stack[-1][0] >= indent:
            stack.pop()
        above = lines[number - 2].strip() if number > 1 else ""
        described = above.startswith("#") or any(d for _, _, d in stack)
        key = ".".join([k for _, k, _ in stack] + [match.group(1)])
        stack.append((indent, match.group(1), above.startswith("#")))
        out.append((number, key, described))
    return out


def test_every_value_in_values_yaml_is_described() -> None:
    keys = _described_keys()
    assert len(keys) > 100
    undescribed = [f"values.yaml:{n} {k}" for n, k, ok in keys if not ok]
    assert undescribed == []


def test_every_values_yaml_key_is_in_the_schema() -> None:
    """Each key of values.yaml (outside lists and free-form Kubernetes objects) is declared in the schema."""
    schema = chart().schema
    assert schema is not None
    free_form = {
        "resources",
        "nodeSelector",
        "affinity",
        "annotations",
        "labels",
        "podLabels",
        "podAnnotations",
        "rayStartParams",
        "podSecurityContext",
        "securityContext",
        "commonLabels",
        "api_key_hashes",
    }
    missing = []
    for number, key, _ in _described_keys():
        node = schema
        for part in key.split("."):
            if "$ref" in node:
                node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
            props = node.get("properties")
            if props is None:
                break
            if part not in props:
                missing.append(f"values.yaml:{number} {key}")
                break
            node = props[part]
            if part in free_form:
                break
    assert missing == []
