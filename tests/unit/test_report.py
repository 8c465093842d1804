"""What an eval run reports: accuracy over the scored tasks, and over every task run with an aborted one as
0 (OSWorld's way), per domain, the skipped tasks in neither."""

from guirl.actors.coordinator import TaskResult
from guirl.report import domain_table
from guirl.vmpool.tasks.suite import SkippedTask


def _result(task: str, domain: str, status: str, score: float | None) -> TaskResult:
    return TaskResult(task, domain, status, score, "done", f"ep-{task}", 1, 3, [], 1.0)


def test_accuracy_over_the_scored_tasks_and_over_all_with_aborted_as_zero() -> None:
    results = [
        _result("a", "calc", "completed", 1.0),
        _result("b", "calc", "completed", 0.0),
        _result("c", "calc", "aborted", None),
        _result("d", "terminal", "completed", 0.5),
    ]
    per_domain, table = domain_table(results, [SkippedTask("e", "chrome", ["metric:x"])])
    calc, everything = per_domain["calc"], per_domain["all"]
    assert (calc["accuracy"], calc["accuracy_all"], calc["aborted"]) == (0.5, 0.3333, 1)
    # all: 1.5 scored over 3 scored tasks; over the 4 run (the skipped one was never run)
    assert (everything["accuracy"], everything["accuracy_all"]) == (0.5, 0.375)
    assert (everything["tasks"], everything["skipped"], everything["aborted"]) == (5, 1, 1)
    assert per_domain["chrome"]["accuracy_all"] is None  # nothing of it ran
    lines = table.splitlines()
    assert lines[0].split()[-3:] == ["accuracy", "all", "(0)"]
    assert lines[-2].split()[-2:] == ["50.0%", "37.5%"]
    assert "an aborted one as 0" in lines[-1]
