import csv
import io

import pytest

from jobs.exports import spreadsheet_safe


@pytest.mark.parametrize(
    "value,expected",
    [
        ("=1+2", "'=1+2"),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1:A2)", "'@SUM(A1:A2)"),
        ("\t=1+2", "'\t=1+2"),
        ("\r=1+2", "'\r=1+2"),
        ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
        ("-", "'-"),
        # Genuine numbers stay numbers, signed or not.
        ("-0.5", "-0.5"),
        ("+3", "+3"),
        ("-1e-05", "-1e-05"),
        ("-.25", "-.25"),
        (-0.5, -0.5),
        (0.25, 0.25),
        (7, 7),
        # Text that merely contains the characters later is left alone.
        ("a=b", "a=b"),
        ("billing", "billing"),
        ("", ""),
        ('[{"type": "email"}]', '[{"type": "email"}]'),
    ],
)
def test_formula_cells_are_neutralized_and_numbers_kept(value, expected):
    assert spreadsheet_safe(value) == expected


def test_a_negative_score_round_trips_through_csv_as_a_number():
    buf = io.StringIO()
    csv.writer(buf).writerow([spreadsheet_safe(v) for v in ("=evil()", -0.73, "-0.73")])
    assert next(csv.reader(io.StringIO(buf.getvalue()))) == ["'=evil()", "-0.73", "-0.73"]
