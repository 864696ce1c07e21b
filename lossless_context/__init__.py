"""lossless-context: a Lossless Context Management engine for Hermes Agent.

Every message is stored verbatim; old context is replaced by a DAG of
summaries that the agent can search and expand back to the originals.
Importing this package has no side effects and does not need hermes-agent.
"""

__version__ = "0.1.0"

__all__ = ["LCMEngine", "__version__"]


def __getattr__(name: str):
    # Lazy so that `import lossless_context` stays cheap and side-effect free.
    if name == "LCMEngine":
        from .engine import LCMEngine

        return LCMEngine
    raise AttributeError(name)
