"""The tour (python -m attnc): it runs every section, and its training section
learns: the printed loss falls at every report and ends far below where it began.
The sections of documents 002 and 004 print what the float64 NumPy oracle gives
for their inputs and the modules' own parameters."""
import re

import numpy as np

import attnc.__main__ as tour
from toolkit import assert_close, ref_module

SECTIONS = ("000 level 1", "000 level 2", "000 level 3", "000 level 4", "001 MultiHeadAttention",
            "002 逐行解读", "003 by hand", "004 （多头）自注意力机制的PyTorch实现", "training:",
            "inference:")


def test_tour_runs_and_training_loss_falls(capsys):
    tour.main()
    text = capsys.readouterr().out
    for title in SECTIONS:
        assert title in text, f"the tour has no section {title!r}"
    losses = [float(value) for value in re.findall(r"^step\s+\d+\s+loss ([0-9.]+)$", text, re.MULTILINE)]
    assert len(losses) >= 5, text
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] / 10, losses
    # the frozen module against the trained module's own eval forward, bit for bit, before and after an edit
    assert "frozen(x) is net.eval()(x), bit for bit: True" in text
    assert "frozen(x) is still the trained output: True | net(x) is: False" in text


def run_section(section, capsys):
    """(the section's inputs, what it printed, its text), with the tour's print
    options; every array it returns as printed is in the text, as NumPy prints it."""
    with np.printoptions(**tour.PRINT_OPTIONS):
        inputs, printed = section()
        text = capsys.readouterr().out
        for name, value in printed.items():
            if isinstance(value, np.ndarray):
                assert str(value) in text, f"{name} is not printed as returned:\n{value}\n{text}"
    return inputs, printed, text


def test_line_by_line_prints_the_oracles_weights_and_output(capsys):
    inputs, printed, text = run_section(tour.line_by_line, capsys)
    module, x = inputs["module"], inputs["x"]
    output, weights = ref_module(module, x)
    assert_close(printed["attention_weight"], weights, np.float32, "attention_weight")
    assert_close(printed["output"], output, np.float32, "output")
    assert_close(module(x), output, np.float32, "self_att_net(X)")
    assert "(3, 2, 4) (3, 2, 4) (3, 2, 4)" in text and "K.transpose(-1, -2): (3, 2, 2)" in text
    printed_difference = float(re.search(r"max \|difference\| = (\S+)", text).group(1))
    assert printed_difference <= 1e-6, text   # two float32 computations of the same sums
    assert printed["head_dim"] == 256 // 8 and text.rstrip().endswith(": 32")


def test_self_attention_templates_print_the_oracles_weights_and_outputs(capsys):
    inputs, printed, text = run_section(tour.self_attention_templates, capsys)
    output, weights = ref_module(inputs["module"], inputs["x"])
    assert_close(printed["dist"], weights, np.float32, "SelfAttention dist")
    assert_close(printed["att_0"], output[0], np.float32, "SelfAttention att[0]")
    output, weights = ref_module(inputs["multi_head"], inputs["x"], inputs["mask"])
    assert_close(printed["multi_head_dist_1"], weights[1], np.float32, "MultiHeadSelfAttention dist[1]")
    assert_close(printed["multi_head_att_1"], output[1], np.float32, "MultiHeadSelfAttention att[1]")
    assert np.all(printed["multi_head_dist_1"][..., 3] == 0)   # the padded key: exp(-1e20 - max) is 0
    for shape in ("(2, 4, 4)", "(2, 4, 8)", "(2, 2, 4, 4)"):
        assert shape in text, shape


def test_the_tour_has_help_and_refuses_unknown_options():
    """`python -m attnc --help` ran the whole tour (its arguments were never read)."""
    import subprocess
    import sys
    helped = subprocess.run([sys.executable, "-m", "attnc", "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m attnc")
    assert "a tour of the documents' own examples" in helped.stdout and "=====" not in helped.stdout
    refused = subprocess.run([sys.executable, "-m", "attnc", "--fast"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unrecognized arguments: --fast" in refused.stderr
    stripped = subprocess.run([sys.executable, "-OO", "-m", "attnc", "--help"], capture_output=True, text=True,
                              timeout=60)  # no docstrings: no description
    assert stripped.returncode == 0 and stripped.stdout.startswith("usage: python -m attnc"), stripped.stderr
