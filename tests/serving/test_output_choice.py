"""Which outputs a request is sent (rose_backend/serving/output_choice.py): what it names, or the
request parameter `outputs` where it names none; every named output is sent or refused by name."""
import pytest

from rose_backend.serving.output_choice import ALL_OUTPUTS, choose_outputs, named_none, refuse_unsent

ROSE = ALL_OUTPUTS | {"SCORES"}                 # what `rose` declares: a request naming none arrives naming these
SPARSE = {"SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS"}
COLBERT = {"COLBERT", "COLBERT_LENS"}


def test_names_decide_when_given():
    assert choose_outputs({"SPARSE_IDS"}, None, ROSE) == ({"SPARSE_IDS"}, {"sparse"})
    assert choose_outputs({"EMBEDDINGS", "COLBERT", "TRUNCATED"}, None, ROSE) == ({"EMBEDDINGS", "COLBERT", "TRUNCATED"},
                                                                                  {"colbert"})
    # every embedding output named, SCORES not: an explicit choice, all of it sent
    assert choose_outputs(ALL_OUTPUTS, None, ROSE)[0] == ALL_OUTPUTS


def test_naming_none_means_what_the_model_says_or_the_parameter():
    assert named_none(ROSE, ROSE) and named_none(set(), ROSE) and not named_none(ALL_OUTPUTS, ROSE)
    assert choose_outputs(ROSE, None, ROSE) == ({"EMBEDDINGS"}, frozenset())                  # rose: dense rows
    assert choose_outputs(ALL_OUTPUTS, None, ALL_OUTPUTS, none_means=ALL_OUTPUTS)[0] == ALL_OUTPUTS   # encode: all
    names, engine = choose_outputs(ROSE, "sparse, Truncated", ROSE)
    assert names == {"EMBEDDINGS", "TRUNCATED"} | SPARSE and engine == {"sparse"}
    assert choose_outputs(ROSE, "", ROSE)[0] == {"EMBEDDINGS"} == choose_outputs(ROSE, "dense", ROSE)[0]


def test_a_parameter_that_agrees_with_the_names_is_fine():
    assert choose_outputs({"EMBEDDINGS", "SPARSE_IDS", "SPARSE_LENS"}, "sparse", ROSE)[0] == {"EMBEDDINGS", "SPARSE_IDS",
                                                                                            "SPARSE_LENS"}
    assert choose_outputs({"EMBEDDINGS"}, "", ROSE)[0] == {"EMBEDDINGS"}


@pytest.mark.parametrize("requested, parameter, message", [
    ({"EMBEDDINGS", "SPARSE_IDS"}, "colbert", "names SPARSE_IDS as outputs but its parameter 'outputs'"),
    ({"EMBEDDINGS", "TOKEN_COUNTS"}, "", "names TOKEN_COUNTS as outputs"),
    # what `embed`'s rose step sees when a client asks for sparse by parameter: EMBEDDINGS only
    ({"EMBEDDINGS"}, "sparse", "asks for sparse, but the request does not name SPARSE_IDS, SPARSE_WEIGHTS, SPARSE_LENS"),
    ({"EMBEDDINGS", "COLBERT"}, "colbert,token_counts", "does not name TOKEN_COUNTS"),
    ({"EMBEDDINGS", "SCORES"}, None, "output SCORES: this embedding model sends"),
    ({"EMBEDDINGS"}, "bm25", "takes sparse, colbert, token_counts, truncated"),
])
def test_what_would_not_be_sent_is_refused_by_name(requested, parameter, message):
    with pytest.raises(ValueError, match=message):
        choose_outputs(requested, parameter, ROSE)


def test_refuse_unsent():
    refuse_unsent({"SCORES"}, ROSE, frozenset({"SCORES"}), "this reranker")
    refuse_unsent(ROSE, ROSE, frozenset({"SCORES"}), "this reranker")                      # none named
    with pytest.raises(ValueError, match="output EMBEDDINGS: this reranker sends SCORES only"):
        refuse_unsent({"SCORES", "EMBEDDINGS"}, ROSE, frozenset({"SCORES"}), "this reranker")
