"""tests/xdist_groups.py: which unit each module is, and the order units are sent in under
``-n 2 --dist loadgroup`` (the two shared-Ray units first, the own-Ray modules next, the rest after)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.xdist_groups import FAULTS_UNIT, RAY_UNIT, module_units, send_order


@dataclass
class FakeItem:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)
    own_ray: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "own_ray" and self.own_ray else None


ITEMS = [
    FakeItem("tests/a/test_demo.py::test_demo", own_ray=True),
    FakeItem("tests/a/test_plain.py::test_one"),
    FakeItem("tests/f/test_soak.py::test_soak", ["fault_url", "fault_port"]),
    FakeItem("tests/b/test_served.py::test_first", ["base_url", "ray_serve"]),
    FakeItem("tests/b/test_mixed.py::test_alone"),
    FakeItem("tests/b/test_mixed.py::test_through_serve", ["fault_port"]),
    FakeItem("tests/b/test_mixed.py::test_through_the_cluster", ["serve_port"]),
    FakeItem("tests/a/test_plain.py::test_two"),
    FakeItem("tests/c/test_drain.py::test_sigterm", own_ray=True),
    FakeItem("tests/c/test_drain.py::test_helper"),
    FakeItem("tests/f/test_fuzz.py::test_fuzz", ["fault_url", "fault_port"]),
    FakeItem("tests/f/test_fuzz.py::test_helper"),
]


def test_each_shared_ray_module_is_in_its_rays_unit_and_the_rest_are_their_own() -> None:
    units = module_units(ITEMS)
    assert units == {
        "tests/a/test_demo.py": "tests/a/test_demo.py",
        "tests/a/test_plain.py": "tests/a/test_plain.py",
        "tests/f/test_soak.py": FAULTS_UNIT,
        "tests/b/test_served.py": RAY_UNIT,
        "tests/b/test_mixed.py": RAY_UNIT,  # fault_port first, serve_port after: the cluster's Ray
        "tests/c/test_drain.py": "tests/c/test_drain.py",
        "tests/f/test_fuzz.py": FAULTS_UNIT,
    }


def test_the_shared_ray_units_go_first_then_own_ray_modules_then_the_rest_in_collection_order() -> None:
    order = [item.nodeid for item in send_order(ITEMS, module_units(ITEMS))]
    assert order == [
        "tests/b/test_served.py::test_first",
        "tests/b/test_mixed.py::test_alone",
        "tests/b/test_mixed.py::test_through_serve",
        "tests/b/test_mixed.py::test_through_the_cluster",
        "tests/f/test_soak.py::test_soak",
        "tests/f/test_fuzz.py::test_fuzz",
        "tests/f/test_fuzz.py::test_helper",
        "tests/a/test_demo.py::test_demo",
        "tests/c/test_drain.py::test_sigterm",
        "tests/c/test_drain.py::test_helper",
        "tests/a/test_plain.py::test_one",
        "tests/a/test_plain.py::test_two",
    ]
