"""splitserve against other servers: the same client and load, one session.

    python -m lab.versus install llama-cpp        # into ~/.cache/splitserve/competitors/llama-cpp
    python -m lab.versus run --server splitserve --server llama-cpp \\
        --concurrency 1,16 --rounds 2 --out-md versus-table.md

installs.py makes each competitor's virtual environment (outside the repository), servers.py
knows how to start each server on the default model's GGUF, run.py alternates them under
`splitserve bench`'s load and writes the ratios.
"""
