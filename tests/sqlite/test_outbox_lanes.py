"""The lane tests of tests/integration/test_outbox_lanes.py that need no PostgreSQL, on SQLite:
its commit stores each intent's lane, and the relay's claim leaves a full lane out by it."""

from tests.integration import test_outbox_lanes as shared

pytestmark = shared.pytestmark
test_a_full_lane_is_left_out_of_the_claim_under_every_spelling = (
    shared.test_a_full_lane_is_left_out_of_the_claim_under_every_spelling
)
test_a_claim_takes_at_most_per_lane_of_one_receiver_spelled_four_ways = (
    shared.test_a_claim_takes_at_most_per_lane_of_one_receiver_spelled_four_ways
)
test_the_batch_commit_stores_each_intents_lane_and_a_bad_url_fails_no_batch_mate = (
    shared.test_the_batch_commit_stores_each_intents_lane_and_a_bad_url_fails_no_batch_mate
)
test_a_row_planted_through_the_orm_gets_its_lane = (
    shared.test_a_row_planted_through_the_orm_gets_its_lane
)
