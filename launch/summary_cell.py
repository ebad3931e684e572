"""A cell of `bert-jax sweep summary`'s table: the text summary.md shows, and the numbers behind it, which summary.csv
holds each in its own column (`<column>/<name>`), so a spreadsheet reads numbers, not "82.0 [80.0–84.0] ≈"."""


class Cell(str):
    """A str (its text, as summary.md and a `==` read it) that carries its numbers ({name: value})."""

    numbers: dict

    def __new__(cls, text: str, numbers: dict) -> "Cell":
        cell = super().__new__(cls, text)
        cell.numbers = dict(numbers)
        return cell


def csv_columns(table: list[dict], columns: list[str]) -> tuple[list[str], list[dict]]:
    """(summary.csv's columns, its rows): each column that holds Cells becomes one column per number."""
    out_columns, expanded = [], {}
    for column in columns:
        names = list(dict.fromkeys(n for row in table if isinstance(row.get(column), Cell)
                                   for n in row[column].numbers))
        expanded[column] = names
        out_columns += [f"{column}/{n}" for n in names] if names else [column]
    rows = []
    for row in table:
        out = {}
        for column in columns:
            value = row.get(column)
            if expanded[column]:
                numbers = value.numbers if isinstance(value, Cell) else {}
                out.update({f"{column}/{n}": numbers.get(n) for n in expanded[column]})
            else:
                out[column] = value
        rows.append(out)
    return out_columns, rows
