"""Human review of a run's episodes: stored beside the run, turned into training data.

`store` keeps the reviews (`<run_dir>/reviews.jsonl`, written by the dashboard); `training`
turns them into samples for `train` (`offline.format: review`): rewards, SFT samples or DPO
pairs. See docs/dashboard.md.
"""

from agentscope_rft.review.store import REVIEWS_FILE, Review, ReviewError, ReviewStore
from agentscope_rft.review.training import ReviewDataError, load_review_samples

__all__ = [
    "REVIEWS_FILE",
    "Review",
    "ReviewDataError",
    "ReviewError",
    "ReviewStore",
    "load_review_samples",
]
