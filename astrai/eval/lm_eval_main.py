"""lm-evaluation-harness's own command line with the `astrai` model registered:

    python -m astrai.eval.lm_eval_main --model astrai --model_args pretrained=CKPT --tasks ...

(also installed as `astrai-lm-eval`). Every argument is lm-eval's; lm-eval 0.4 finds
models only in its registry, so the registering import has to run first.
"""

from __future__ import annotations


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    import astrai.eval.harness  # noqa: F401  (registers "astrai")

    cli_evaluate()


if __name__ == "__main__":
    main()
