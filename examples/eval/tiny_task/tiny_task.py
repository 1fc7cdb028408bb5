"""The data of tiny_task.yaml: tiny_task.jsonl beside this file, as lm-eval's
`custom_dataset` (a function returning the splits). Read here rather than through a
`data_files` path, which `datasets` would resolve against the current directory."""

import json
from pathlib import Path

DATA = Path(__file__).with_name("tiny_task.jsonl")


def load(**_):
    import datasets

    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
