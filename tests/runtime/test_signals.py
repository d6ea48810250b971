"""Signals held back for a moment: the processes a run starts never see a terminal's Ctrl-C (their driver stops
them), from their first instruction on."""

import multiprocessing
import signal

from runtime import signals


def _report_ctrl_c(results) -> None:
    """What the spawned process does on SIGINT, as it starts: before any module of the bench is imported there."""
    handler = signal.getsignal(signal.SIGINT)
    results.send("ignored" if handler == signal.SIG_IGN else repr(handler))


def test_a_process_started_kept_from_children_ignores_ctrl_c_from_its_start():
    """Probe 28, #3: the signal mask the workers were started with does not pass through a spawned Python's exec, so
    a Ctrl-C while they imported the bench printed a worker's KeyboardInterrupt traceback beside the driver's line."""
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_report_ctrl_c, args=(writer,))
    before = signal.getsignal(signal.SIGINT)
    with signals.kept_from_children():
        process.start()
    assert signal.getsignal(signal.SIGINT) is before  # this process takes Ctrl-C again as it did
    writer.close()
    assert reader.recv() == "ignored"
    process.join(30)
    assert process.exitcode == 0
