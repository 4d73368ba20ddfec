"""The shared argument checks (workbench.checks): one policy on bools, NaN, infinity, numpy
scalars and strings, and errors that name the value and what is accepted."""
import math

import numpy as np
import pytest

from workbench.checks import (check_bool, check_choice, check_fraction, check_int,
                              check_non_negative, check_positive, check_real)

NAN, INF = float("nan"), float("inf")


# ---- counts --------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1, 7, np.int64(3), np.int32(1), np.uint8(2)])
def test_counts_accept_python_and_numpy_integers_and_return_an_int(value):
    got = check_int("workers", value, 1)
    assert got == value and type(got) is int


@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, np.float64(2), "2", None, NAN,
                                   INF, [2]])
def test_counts_refuse_bools_floats_strings_and_small_values(value):
    with pytest.raises(ValueError) as err:
        check_int("workers", value, 1)
    assert str(err.value) == f"workers must be an integer >= 1, got {value!r}"


def test_counts_with_an_upper_bound_say_the_range():
    assert check_int("seed", 2**64 - 1, 0, 2**64 - 1) == 2**64 - 1
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 9\], got 10"):
        check_int("seed", 10, 0, 9)


def test_optional_counts_accept_none_and_say_what_it_means():
    assert check_int("max_batch_size", None, 1, optional=True) is None
    assert check_int("max_batch_size", 4, 1, optional=True) == 4
    with pytest.raises(ValueError, match=r"^max_batch_size must be None or an integer >= 1, "
                                         r"got 0$"):
        check_int("max_batch_size", 0, 1, optional=True)
    with pytest.raises(ValueError, match=r"threshold must be None \(learned per bucket\) or an "
                                         r"integer >= 1, got True"):
        check_int("threshold", True, 1, optional="learned per bucket")
    with pytest.raises(ValueError, match="must be an integer >= 1, got None"):
        check_int("workers", None, 1)  # not optional: None is refused like anything else


# ---- amounts -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0.5, 3, np.float32(0.25), np.float64(2.0), np.int64(4)])
def test_amounts_accept_python_and_numpy_numbers_and_return_a_float(value):
    got = check_positive("lr", value)
    assert got == pytest.approx(float(value)) and type(got) is float


@pytest.mark.parametrize("value", [True, False, "0.1", None, NAN, np.float64("nan"), INF,
                                   -INF, 0, -0.1])
def test_positive_refuses_bools_strings_nan_inf_and_non_positive(value):
    with pytest.raises(ValueError) as err:
        check_positive("lr", value)
    assert str(err.value) == f"lr must be a finite number > 0, got {value!r}"


def test_infinity_only_where_a_check_accepts_it():
    assert check_positive("minutes", INF, allow_inf=True) == INF
    assert check_non_negative("budget", INF, allow_inf=True) == INF
    with pytest.raises(ValueError, match=r"^minutes must be a number > 0 \(inf accepted\), "
                                         r"got nan$"):
        check_positive("minutes", NAN, allow_inf=True)  # NaN stays refused
    with pytest.raises(ValueError, match="budget must be a finite number >= 0, got inf"):
        check_non_negative("budget", INF)


def test_non_negative_accepts_zero():
    assert check_non_negative("ce_weight", 0) == 0.0
    with pytest.raises(ValueError, match=r"ce_weight must be a finite number >= 0, got -0\.5"):
        check_non_negative("ce_weight", -0.5)


def test_ranges_with_open_and_closed_ends():
    assert check_real("x", -3.5) == -3.5  # no bound: any finite number
    with pytest.raises(ValueError, match="x must be a finite number, got inf"):
        check_real("x", INF)
    assert check_real("beta", 0, 0, 1, high_open=True) == 0.0
    with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\), got 1"):
        check_real("beta", 1, 0, 1, high_open=True)
    with pytest.raises(ValueError, match=r"x must be a finite number <= 2, got 3"):
        check_real("x", 3, high=2)
    with pytest.raises(ValueError, match=r"x must be a finite number > 1, got 1"):
        check_real("x", 1, 1, low_open=True)


# ---- probabilities and fractions ----------------------------------------------------------------
@pytest.mark.parametrize("value", [0, 1, 0.5, np.float64(0.25), np.int64(1)])
def test_fractions_accept_the_closed_unit_interval(value):
    assert check_fraction("epsilon", value) == float(value)


@pytest.mark.parametrize("value", [-0.1, 1.01, True, NAN, INF, "0.5", None])
def test_fractions_refuse_the_rest(value):
    with pytest.raises(ValueError) as err:
        check_fraction("epsilon", value)
    assert str(err.value) == f"epsilon must be a number in [0, 1], got {value!r}"


def test_fractions_with_an_open_end():
    assert check_fraction("top_p", 1, low_open=True) == 1.0
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got 0"):
        check_fraction("top_p", 0, low_open=True)
    assert check_fraction("harvest_share", None, low_open=True, optional=True) is None


# ---- choices --------------------------------------------------------------------------------
def test_a_choice_returns_the_accepted_value():
    assert check_choice("spec_mode", "coupled", ("coupled", "speculative")) == "coupled"
    got = check_choice("spec_mode", np.str_("speculative"), ("coupled", "speculative"))
    assert got == "speculative" and type(got) is str
    assert check_choice("k", np.int64(4), (2, 4)) == 4
    assert check_choice("mode", None, ("a", "b"), optional=True) is None


def test_a_refused_choice_names_the_value_and_the_accepted_set():
    with pytest.raises(ValueError) as err:
        check_choice("batching", "wave", ("continuous", "waves"))
    assert str(err.value) == "batching must be one of 'continuous', 'waves', got 'wave'"
    with pytest.raises(ValueError, match=r"^mode must be None \(no KD\) or one of 'a', 'b', "
                                         r"got 'c'$"):
        check_choice("mode", "c", ("a", "b"), optional="no KD")


@pytest.mark.parametrize("value", [True, np.bool_(True), 1.0 + 1e-9, "1", None, [1],
                                   np.array([1, 2])])
def test_a_choice_of_numbers_refuses_bools_and_near_misses(value):
    with pytest.raises(ValueError, match="k must be one of 1, 2, got "):
        check_choice("k", value, (1, 2))


def test_a_choice_that_holds_bools_accepts_them():
    assert check_choice("flag", True, (True, False, "auto")) is True
    with pytest.raises(ValueError):
        check_choice("flag", 1, (True, False, "auto"))


# ---- switches -------------------------------------------------------------------------------
def test_switches_accept_bools_only():
    assert check_bool("harvest", True) is True
    assert check_bool("harvest", np.bool_(False)) is False
    for value in (0, 1, "false", None, NAN):
        with pytest.raises(ValueError) as err:
            check_bool("harvest", value)
        assert str(err.value) == f"harvest must be True or False, got {value!r}"


def test_errors_name_nan_values_readably():
    with pytest.raises(ValueError, match="got nan"):
        check_real("x", math.nan, 0)
