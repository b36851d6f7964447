"""The tour (python -m attnc): it runs every section, and its training section
learns: the printed loss falls at every report and ends far below where it began."""
import re

import attnc.__main__ as tour


def test_tour_runs_and_training_loss_falls(capsys):
    tour.main()
    text = capsys.readouterr().out
    for title in ("000 level 1", "000 level 2", "000 level 3", "000 level 4", "training:"):
        assert title in text, f"the tour has no section {title!r}"
    losses = [float(value) for value in re.findall(r"^step\s+\d+\s+loss ([0-9.]+)$", text, re.MULTILINE)]
    assert len(losses) >= 5, text
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] / 10, losses
