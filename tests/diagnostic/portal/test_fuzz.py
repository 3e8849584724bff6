"""Bad input on the three submission paths: whatever a customer sends, the answer is the
configuration page with an error at a field, or the preview; never a traceback."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnostic.bookings.models import Booking
from diagnostic.portal.submission import STRUCTURED_FIELDS, input_name
from tests.diagnostic.conftest import Cast

pytestmark = pytest.mark.django_db
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

FLAGS = [
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--max-model-len",
    "--kv-cache-dtype",
    "--speculative-config",
    "--enable-expert-parallel",
    "--gpu-memory-utilization",
    "--tp",
    "--model-path",
    "--load-format",
    "--quantization",
    "-tp",
    "--",
    "\\",
    "'",
    '"',
    "{",
    "}",
    "=",
    "\n",
]
words = st.one_of(st.sampled_from(FLAGS), st.text(max_size=12), st.integers(-5, 10**9).map(str))
commands = st.one_of(
    st.text(max_size=300),
    st.lists(words, max_size=20).map(lambda w: "vllm serve " + " ".join(w)),
    st.lists(words, max_size=20).map(lambda w: "python3 -m sglang.launch_server " + " ".join(w)),
    st.lists(words, max_size=20).map(lambda w: "A=1 B='x y' vllm serve /m " + " ".join(w)),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=20)
)
yaml_values = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=20,
)
top_keys = st.sampled_from(
    [
        "schema",
        "engine",
        "model",
        "cluster",
        "parallel",
        "serving",
        "speculative",
        "env",
        "extra_args",
        "workloads",
        "reported",
        "launch_command",
        "other",
    ]
)
documents = st.dictionaries(top_keys, yaml_values, max_size=8)
yaml_texts = st.one_of(
    st.text(max_size=400),
    documents.map(lambda d: __import__("yaml").safe_dump(d)),
    st.sampled_from(
        [
            "[" * 5000,
            "a: &x [1]\nb: *x",
            "? [1, 2]\n: 3",
            "!!python/object:os.system x",
            "\ufeffschema: diagnostic.config/1",
            "a: 1\na: 2",
            "- 1\n- 2",
        ]
    ),
)
form_values = st.fixed_dictionaries(
    {
        input_name(d): st.one_of(
            st.text(max_size=20), st.sampled_from(["", "8", "0", "-1", "1e9", "nan", "on"])
        )
        for d, _ in STRUCTURED_FIELDS
    }
)




def check(response: Any, error_input: str) -> None:
    assert response.status_code in (200, 400), response.status_code
    page = response.content.decode()
    if response.status_code == 400:
        assert 'class="field-error"' in page or 'class="error"' in page
    else:
        assert 'id="launch-command"' in page


@FUZZ
@given(command=commands)
def test_pasted_commands_never_crash(cast: Cast, booking: Booking, command: str) -> None:
    response = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/config/",
        {"source": "command", "command": command, "action": "preview"},
    )
    check(response, "command")


@FUZZ
@given(text=yaml_texts)
def test_yaml_texts_never_crash(cast: Cast, booking: Booking, text: str) -> None:
    response = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/config/", {"source": "yaml", "yaml_text": text, "action": "preview"}
    )
    check(response, "yaml_text")


@FUZZ
@given(content=st.binary(max_size=600))
def test_uploaded_bytes_never_crash(cast: Cast, booking: Booking, content: bytes) -> None:
    upload = SimpleUploadedFile("config.yaml", content)
    response = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/config/",
        {"source": "yaml", "yaml_file": upload, "action": "preview"},
    )
    check(response, "yaml_text")


@FUZZ
@given(values=form_values)
def test_structured_forms_never_crash(cast: Cast, booking: Booking, values: dict[str, str]) -> None:
    response = cast.client("alice").post(
        f"/portal/bookings/{booking.uuid}/config/", {"source": "form", **values, "action": "preview"}
    )
    check(response, "form")
