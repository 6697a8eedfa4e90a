"""benchmarks/published_data.py: the data file's records come back as cases, or are refused."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import published_data as data  # noqa: E402 - benchmarks/ is not a package

SOURCE = """
[sources.guide]
publication = "A guide"
title = "The guide"
url = "https://example.org/guide"
citation = "org/repo guide.md @ abc123"

[sources.guide.setups]
bench = "One A100, batch 1."

[sources.guide.shared]
measured = "max_memory_allocated"
mode = "inference"
method = "inference"
"""
RUN = """
[[runs]]
key = "guide_small"
source = "guide"
setup = "bench"
quote = "Memory used: 1.5 GB"
figure = "1.5"
unit = "GiB"
model = "gpt2"
notes = "Small model."
"""


def test_a_run_takes_its_sources_citation_setup_and_shared_fields():
    loaded = data.loads(SOURCE + RUN + RUN.replace("guide_small", "guide_other") + "heldout = true")
    case, held = loaded.cases[0], loaded.heldout[0]
    assert case.key == "guide_small" and held.key == "guide_other"
    assert case.source == "org/repo guide.md @ abc123"
    assert case.publication == "A guide"
    assert case.notes == "Small model. One A100, batch 1."
    assert case.value_bytes == 3 * 2**29  # 1.5 GiB, exactly
    assert (case.measured, case.mode) == ("max_memory_allocated", "inference")
    assert case.method == "inference"
    assert loaded.sources["guide"].date is None


def test_a_verdict_carries_no_figure():
    verdict = RUN.replace('figure = "1.5"\nunit = "GiB"\n', 'gpu = "A100 40GB"\n')
    verdict = verdict.replace('setup = "bench"', 'measured = "oom"')
    case = data.loads(SOURCE.replace('measured = "max_memory_allocated"\n', "") + verdict).cases[0]
    assert (case.measured, case.value_bytes, case.notes) == ("oom", None, "Small model.")


def test_an_unknown_field_is_refused_naming_the_run():
    with pytest.raises(ValueError, match=r"'guide_small' \(runs\[0\]\): unknown field.*'figur'"):
        data.loads(SOURCE + RUN.replace("figure =", "figur ="))


def test_an_unknown_source_is_refused_naming_the_run_and_the_known_ones():
    with pytest.raises(ValueError, match=r"'guide_small'.*source 'guid' is not defined.*'guide'"):
        data.loads(SOURCE + RUN.replace('source = "guide"', 'source = "guid"'))


def test_an_unknown_field_in_a_source_is_refused_naming_the_source():
    with pytest.raises(ValueError, match=r"\[sources.guide\]: unknown field.*'titel'"):
        data.loads(SOURCE.replace("title =", "titel =") + RUN)
    with pytest.raises(ValueError, match=r"\[sources.guide\].shared: unknown field.*'quote'"):
        data.loads(SOURCE + 'quote = "shared quotes are not allowed"\n' + RUN)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('quote = "Memory used: 1.5 GB"\n', ""), r"missing field\(s\) \['quote'\]"),
        (('model = "gpt2"', 'model = "gpt2"\nmode = "train"'), r"\['mode'\] stated by the run and"),
        (('setup = "bench"', 'setup = "bnch"'), r"setup 'bnch' is not one of"),
        (('model = "gpt2"', "model = 2"), r"model = 2 should be a string"),
        (('model = "gpt2"', 'model = "gpt2"\nbatch_size = true'), r"batch_size = True should be"),
        (('unit = "GiB"\n', ""), r"figure and unit go together"),
        (('unit = "GiB"', 'unit = "gigs"'), r"unit 'gigs' is not one of"),
        (('figure = "1.5"', 'figure = "1,5"'), r"figure '1,5' is not a number"),
        (('notes = "Small model."', "ambiguous = true\nheldout = true"), r"held out but ambiguous"),
    ],
)
def test_a_bad_run_is_refused_with_what_to_fix(change, message):
    with pytest.raises(ValueError, match=r"guide_small.*" + message):
        data.loads(SOURCE + RUN.replace(*change))


def test_a_run_key_appears_once_and_a_case_check_names_the_record():
    with pytest.raises(ValueError, match="'guide_small' appears twice"):
        data.loads(SOURCE + RUN + RUN)
    with pytest.raises(ValueError, match=r"runs\[0\]\).*measured='peak' is not one of"):
        data.loads(SOURCE.replace('"max_memory_allocated"', '"peak"') + RUN)


def test_the_file_is_named_in_errors(tmp_path):
    path = tmp_path / "runs.toml"
    path.write_text(SOURCE + RUN.replace('"guide"', '"nowhere"'), encoding="utf-8")
    with pytest.raises(ValueError, match=r"^runs.toml: run 'guide_small'"):
        data.load(path)
    path.write_text("runs = [", encoding="utf-8")
    with pytest.raises(ValueError, match=r"runs\.toml: not valid TOML"):
        data.load(path)


def test_every_source_and_setup_of_the_data_file_is_used():
    loaded = data.load()
    cases = (*loaded.cases, *loaded.heldout)
    cited = {case.source for case in cases}
    assert {source.citation for source in loaded.sources.values()} == cited
    for source in loaded.sources.values():
        notes = [case.notes for case in cases if case.source == source.citation]
        for name, setup in source.setups.items():
            assert any(note.endswith(setup) for note in notes), (source.key, name)


def test_a_source_states_its_recipe_and_what_of_it_is_not_modelled():
    text = SOURCE.replace(
        'citation = "org/repo guide.md @ abc123"\n',
        'citation = "org/repo guide.md @ abc123"\nrecipe = "run.py @ abc123"\n'
        'not_modelled = "torch.compile"\n',
    )
    source = data.loads(text + RUN).sources["guide"]
    assert (source.recipe, source.not_modelled) == ("run.py @ abc123", "torch.compile")
    assert data.loads(SOURCE + RUN).sources["guide"].recipe is None
    with pytest.raises(ValueError, match=r"\[sources.guide\]: recipe = 3 should be a string"):
        data.loads(SOURCE.replace('url = "', 'recipe = 3\nurl = "') + RUN)


LONGEST_FITS = RUN.replace(
    'figure = "1.5"\nunit = "GiB"\n', 'gpu = "24 GB VRAM (card not named)"\n'
)


@pytest.mark.parametrize(
    ("measured", "seq_len", "fine"),
    [
        ("fits", "seq_len = 512\n", True),
        ("oom", "", True),
        ("fits", "", False),
        ("oom", "seq_len = 512\n", False),
    ],
)
def test_a_maximum_context_row_is_a_fits_at_its_length_or_an_oom_without_one(
    measured, seq_len, fine
):
    shared = SOURCE.replace('measured = "max_memory_allocated"\n', "")
    run = LONGEST_FITS.replace(
        'setup = "bench"', f'measured = "{measured}"\nlongest = true\n{seq_len}'
    )
    if fine:
        case = data.loads(shared + run).cases[0]
        assert case.longest and case.source_key == "guide"
    else:
        with pytest.raises(ValueError, match="longest = true marks"):
            data.loads(shared + run)


def test_every_source_of_the_data_file_states_its_recipe():
    missing = [key for key, source in data.load().sources.items() if not source.recipe]
    assert missing == []
