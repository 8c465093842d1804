"""What a local VM's sandbox lets in of the host's Python: where packages are installed, nothing else."""

from __future__ import annotations

import sys

from guirl.vmpool.sandbox import python_roots


def test_installation_directories_on_sys_path_are_bound_and_a_checkout_is_not(tmp_path, monkeypatch):
    # guirl's dependencies outside the interpreter's prefixes (a user site, a `.pth` or PYTHONPATH entry):
    # the VM server imports them, so the sandbox must see them
    deps = tmp_path / "deps"
    (deps / "pyzmq-26.0.dist-info").mkdir(parents=True)
    # a working directory or checkout on sys.path (`python -m`, bin/guirl) holds no installed distribution
    # and stays out: the VM would see the task suite's solutions
    checkout = tmp_path / "checkout"
    (checkout / "tasks").mkdir(parents=True)
    (checkout / "guirl.egg-info").mkdir()
    monkeypatch.chdir(checkout)  # "" on sys.path: the working directory
    monkeypatch.setattr(sys, "path", [str(checkout), *sys.path, str(deps), str(tmp_path / "gone"), ""])
    roots = [where for _, where in python_roots()]
    assert str(deps.resolve()) in roots
    assert str(checkout.resolve()) not in roots and str(tmp_path.resolve()) not in roots
    assert roots == sorted(roots)  # a parent is bound before what lies under it
