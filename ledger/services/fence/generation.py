"""The fence's generation: the arithmetic of tokens across a restore.

A restored database forgets every token issued after its backup, so a per-run counter
would issue them again. The generation is the floor under the tokens: a run's next token
is ``max(previous + 1, generation << FENCE_GENERATION_SHIFT)``. A restore
(``ledger.services.fence.restore.fence_restore``) moves the generation to the Unix second
it runs at, which the rollback cannot undo: every token issued before the restore was
issued under an earlier generation, at most ``2**20`` takeovers of one run per second of
time past that generation's start (far beyond what a run's lease round trips can do), so
the first token after the restore is greater than all of them.

Bounds: a token is at most ``FENCING_TOKEN_MAX`` (2**53 - 1, exact in a JavaScript
number); a generation is at most ``FENCE_GENERATION_MAX`` (2**33 - 1 seconds after the
Unix epoch, in the year 2242). The database's check constraints hold both.
"""

from dataclasses import dataclass

from ledger.models.runs import FENCE_GENERATION_MAX, FENCE_GENERATION_SHIFT, FENCING_TOKEN_MAX


def token_floor(generation: int) -> int:
    """The least token issued under ``generation``."""
    if not 0 <= generation <= FENCE_GENERATION_MAX:
        raise OverflowError(f"fence generation {generation} is outside 0..{FENCE_GENERATION_MAX}")
    return generation << FENCE_GENERATION_SHIFT


def token_next(*, previous: int, generation: int) -> int:
    """The token a run whose last token was ``previous`` is issued under ``generation``."""
    token = max(previous + 1, token_floor(generation))
    if token > FENCING_TOKEN_MAX:
        raise OverflowError(f"fencing token {token} is past {FENCING_TOKEN_MAX} (2**53 - 1)")
    return token


@dataclass(frozen=True)
class NextGeneration:
    generation: int
    # False when the clock was not past the stored generation or the greatest token stored:
    # the host's clock is behind, and tokens issued after the backup may still be reached.
    clock_ahead: bool


def generation_next(*, stored: int, clock_s: int, top_token: int) -> NextGeneration:
    """The generation a restore moves to at Unix second ``clock_s``: the clock's second,
    raised past the ``stored`` generation and the greatest token stored (``top_token``) when
    the clock is behind them."""
    past_stored = max(stored + 1, (top_token >> FENCE_GENERATION_SHIFT) + 1)
    generation = max(clock_s, past_stored)
    token_floor(generation)  # refuses a generation out of range
    return NextGeneration(generation=generation, clock_ahead=clock_s >= past_stored)
