"""The strict YAML loader on libyaml's parser (`FastStrictLoader`, for the many run configs a
listing reads): the same values and the same refusals as the one in Python."""

import pytest
import yaml

from minitfm.config import Config, to_yaml
from minitfm.yamlfile import ALIAS_BUDGET, FastStrictLoader, StrictLoader, load_yaml

BOMB = "\n".join(["a0: &a0 [1,1,1,1,1,1,1,1,1,1]",
                  *(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)),
                  "name: *a8", ""])


def test_libyaml_is_there_to_be_tested():
    """PyYAML's wheels bring libyaml; without it the fast loader is the Python one."""
    assert yaml.__with_libyaml__ and FastStrictLoader is not StrictLoader


@pytest.mark.parametrize("text", [
    to_yaml(Config()),
    "a: 3e-4\nb: yes\nc: 017\nd: 0x1F\ne: null\nf: .inf\ng: '5'\nh: 2026-01-01\n",
    "train: &t {steps: 7, lr: 1e-3}\nlog: {<<: *t}\n",
])
def test_the_fast_loader_reads_what_the_strict_one_reads(text):
    assert load_yaml(text, fast=True) == load_yaml(text)


@pytest.mark.parametrize("text, needle", [
    ("a: 1\na: 2\n", "duplicate key 'a'"),
    (BOMB, f"expand to more than {ALIAS_BUDGET:,} values"),
    ("a: !!python/object/apply:os.system ['echo hi']\n", "python/object/apply"),
    ("a: " + "[" * 20_000 + "]" * 20_000, "maximum nesting depth"),  # not a crash in C
    ("a: " + "{b: " * 3000 + "1" + "}" * 3000, "maximum nesting depth"),
])
def test_the_fast_loader_refuses_what_the_strict_one_refuses(text, needle):
    with pytest.raises(yaml.YAMLError, match=needle.replace("(", r"\(")):
        load_yaml(text, fast=True)
