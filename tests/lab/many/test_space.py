"""A search's ranges in Hydra's sweeper grammar: what each reads as, and the one-line refusals."""

import pytest

from minitfm.errors import ConfigError
from minitfm.lab.many.space import (
    is_search,
    number_text,
    parse_dimension,
    shown,
    split_items,
)


def test_each_form_reads_as_its_dimension():
    lr = parse_dimension("train.lr", "tag(log,interval(1e-3,3e-2))")
    assert (lr.kind, lr.low, lr.high, lr.log, lr.values()) == ("float", 1e-3, 3e-2, True, None)
    uniform = parse_dimension("train.lr", "interval(0.001, 0.01)")
    assert (uniform.kind, uniform.log) == ("float", False)
    warmup = parse_dimension("train.warmup_steps", "range(20,121,20)")
    assert warmup.kind == "int" and warmup.values() == ["20", "40", "60", "80", "100", "120"]
    assert parse_dimension("k", "range(0,3)").values() == ["0", "1", "2"]  # stop excluded
    assert parse_dimension("k", "range(0.5,1.0,0.25)").values() == ["0.5", "0.75"]
    ints = parse_dimension("k", "int(interval(2,5))")
    assert ints.kind == "int" and ints.values() == ["2", "3", "4", "5"]  # both ends
    log_int = parse_dimension("k", "tag(log,int(interval(8,64)))")
    assert (log_int.kind, log_int.log) == ("int", True)
    choice = parse_dimension("model.positional", "choice(sinusoidal, rope)")
    assert choice.values() == ["sinusoidal", "rope"] and choice.ends() == choice.values()


def test_sampled_values_are_written_as_their_runs_take_them():
    lr = parse_dimension("train.lr", "tag(log,interval(1e-3,3e-2))")
    assert lr.value_text(0.006466422717414559) == "0.006466422717414559"  # whole, as drawn
    assert lr.value_text(2.0) == "2.0" and number_text(1e-5) == "1e-05"
    assert number_text(0.1 * 3) == "0.3" and shown("0.006466422717414559") == "0.006466"
    assert shown("60") == "60" and shown("rope") == "rope"
    assert parse_dimension("k", "int(interval(2,5))").value_text(3.0) == "3"
    assert lr.ends() == ["0.001", "0.03"]


def test_optuna_gets_the_distribution_the_text_says():
    pytest.importorskip("optuna")
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    lr = parse_dimension("train.lr", "tag(log,interval(1e-3,3e-2))").distribution()
    assert lr == FloatDistribution(1e-3, 3e-2, log=True)
    warmup = parse_dimension("w", "range(20,121,20)").distribution()
    assert warmup == IntDistribution(20, 120, step=20)
    assert parse_dimension("p", "choice(a,b)").distribution() == CategoricalDistribution(["a", "b"])


@pytest.mark.parametrize("text, words", [
    ("interval(3,1)", "the interval is empty"),
    ("interval(1,1)", "the interval is empty"),
    ("range(5,5)", "the range is empty"),
    ("range(0,10,-1)", "step must be above 0"),
    ("int(interval(1.2,1.8))", "fewer than two whole numbers"),
    ("tag(log,interval(0,1))", "a log range needs bounds above 0"),
    ("tag(log,interval(-1,1))", "a log range needs bounds above 0"),
    ("interval(a,2)", "'a' is not a number"),
    ("interval(1,inf)", "not a finite number"),
    ("interval(1)", "give interval(LOW,HIGH)"),
    ("choice()", "choice(...) takes one value or more"),
    ("choice(a,a)", "gives a value twice"),
    ("tag(lin,interval(1,2))", "takes the tag log"),
    ("interval(1,2", "never closed"),
    ("choice(a,,b)", "an empty argument"),
    ("range(0,100000000)", "at most 10,000"),
    ("range(5,6)", "the range holds one value (5) and searches nothing: set it (train.lr=5)"),
    ("choice(rope)", "choice(...) of one value searches nothing: set it (train.lr=rope)"),
    ("intervall(1,2)", "'intervall' is none of choice, range, interval, int, tag (did you mean "
                       "interval?)"),
    ("rnage(0,31,10)", "(did you mean range?)"),
])
def test_a_bad_range_is_one_line_naming_it(text, words):
    with pytest.raises(ConfigError) as err:
        parse_dimension("train.lr", text)
    message = str(err.value)
    assert words in message and "\n" not in message and message.startswith(f"train.lr={text}")


def test_only_the_grammar_s_functions_make_a_search():
    assert is_search("interval(1,2)") and is_search(" choice(a,b) ")
    assert not is_search("0.01") and not is_search("rope,alibi") and not is_search("f(1)")
    assert is_search("intervall(1,2)") and not is_search("data(1).tsv")  # near misses only
    searched, rest = split_items(["train.lr=interval(1e-3,1e-2)", "seed=0,1", "train.steps=9",
                                  "seed=interval(0,3)"])
    assert searched == [("train.lr", "interval(1e-3,1e-2)")]
    assert rest == ["seed=0,1", "train.steps=9", "seed=interval(0,3)"]  # seeds: the grid's
