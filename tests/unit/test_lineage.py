"""The learner's lineage: which (epoch, version) weights a sample may come from and still be trained."""

from __future__ import annotations

import json

import pytest

from guirl.learner.lineage import LINEAGE_FILE, Lineage


def test_a_fresh_run_is_epoch_zero_and_holds_every_version_up_to_the_learners():
    lineage = Lineage([0])
    assert lineage.epoch == 0
    assert all(lineage.holds(0, v, current=3) for v in (-1, 0, 1, 2, 3))
    assert not lineage.holds(0, 4, current=3)  # from the future
    assert not lineage.holds(1, 2, current=3)  # an epoch that has not begun


def test_a_restart_cuts_off_what_the_previous_learner_made_after_its_checkpoint():
    # epoch 0 published 1..4 and died; epoch 1 restored the checkpoint of version 2 and made 3..5 anew
    lineage = Lineage([0, 2])
    assert lineage.holds(0, 1, current=5) and lineage.holds(0, 2, current=5)  # ancestors of epoch 1
    assert not lineage.holds(0, 3, current=5) and not lineage.holds(0, 4, current=5)  # orphaned
    assert lineage.holds(1, 3, current=5) and lineage.holds(1, 5, current=5)
    assert lineage.holds(0, -1, current=5)  # the starting weights belong to every epoch


def test_a_restart_without_a_checkpoint_keeps_only_the_starting_weights():
    lineage = Lineage([0, 0])
    assert lineage.holds(0, -1, current=0) and lineage.holds(0, 0, current=0)
    assert not lineage.holds(0, 1, current=1)  # epoch 0's version 1 is not epoch 1's
    assert lineage.holds(1, 1, current=1)


def test_a_chain_of_restarts_checks_every_later_fork():
    # epoch 0 to v6 (checkpoint v4), epoch 1 from v4 to v9 (checkpoint v8), epoch 2 from v8
    lineage = Lineage([0, 4, 8])
    assert lineage.holds(0, 4, current=9) and not lineage.holds(0, 5, current=9)
    assert lineage.holds(1, 8, current=9) and not lineage.holds(1, 9, current=9)
    assert lineage.holds(2, 9, current=9)


def test_begin_appends_an_epoch_per_start_and_refuses_a_damaged_record(tmp_path):
    first = Lineage.begin(tmp_path, 0)
    assert first.forks == [0] and first.epoch == 0
    again = Lineage.begin(tmp_path, 3)
    assert again.forks == [0, 3] and again.epoch == 1
    assert json.loads((tmp_path / LINEAGE_FILE).read_text()) == {"forks": [0, 3]}
    for bad in (
        "{",
        '{"forks": []}',
        '{"forks": [0, -2]}',
        '{"forks": [0, "3"]}',
        "[1, 2]",
        '{"forks": [true]}',
    ):
        (tmp_path / LINEAGE_FILE).write_text(bad)
        with pytest.raises(ValueError):
            Lineage.begin(tmp_path, 1)
