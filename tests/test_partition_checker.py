"""The partition harness's checker (tests/partition_history.py) on made-up
histories: each rule passes a history that keeps it and reports one that
breaks it. The harness itself runs in tests/test_cluster_partitions.py."""
from __future__ import annotations

from partition_history import Op, Term, check

# n1 leads until 9.9, no leader is seen from 10 to 11.8, n2 from 12 on (Term: seen, last, not_before, ...)
TERMS = [Term(0.0, 9.9, 0.0, "n1", 1), Term(10.0, 11.8, 9.9, None, None), Term(12.0, 30.0, 11.8, "n2", 2)]


def connect(t, conn, node):
    return Op(t, "connect", conn=conn, node=node)


def published(t, conn, number, outcome="confirm"):
    return [Op(t, "send", conn=conn, number=number), Op(t + 0.01, outcome, conn=conn, number=number)]


def consumed(t, conn, number, redelivered=False, settled=True):
    ops = [Op(t, "deliver", conn=conn, number=number, redelivered=redelivered),
           Op(t + 0.01, "ack", conn=conn, number=number)]
    return ops + [Op(t + 0.02, "settle", conn=conn)] if settled else ops


def test_a_history_that_keeps_every_rule_passes():
    ops = [connect(1, 1, "n1"), connect(1, 2, "n1"), *published(2, 1, 1), *published(3, 1, 2),
           *published(4, 1, 3, "unknown"), *consumed(5, 2, 1),
           # 2 delivered, not acked when n1 went; back flagged from n2
           Op(6, "deliver", conn=2, number=2), connect(13, 3, "n2"), connect(13, 4, "n2"),
           *consumed(14, 4, 2, redelivered=True), *published(15, 3, 4), *consumed(16, 4, 4),
           # 1 was acked on n1, comes back flagged after the failover: allowed (docs/cluster.md)
           *consumed(17, 4, 1, redelivered=True)]
    verdict = check(ops, TERMS)
    assert verdict.ok, verdict.problems()
    assert (verdict.confirmed, verdict.unknown, verdict.acked_back_allowed, verdict.terms) == (3, 1, 1, 2)


def test_a_confirmed_message_never_consumed_is_lost():
    ops = [connect(1, 1, "n1"), *published(2, 1, 1), *published(3, 1, 2), connect(3, 2, "n1"), *consumed(4, 2, 1)]
    assert check(ops, TERMS).lost == [2]


def test_a_confirmed_message_delivered_once_whose_ack_was_never_settled_is_not_lost():
    ops = [connect(1, 1, "n1"), *published(2, 1, 1), connect(3, 2, "n1"), *consumed(4, 2, 1, settled=False)]
    assert check(ops, TERMS).ok


def test_an_acked_message_back_without_a_failover_breaks_rule_2():
    ops = [connect(1, 1, "n1"), *published(2, 1, 1), connect(3, 2, "n1"), *consumed(4, 2, 1),
           *consumed(5, 2, 1, redelivered=True)]
    assert check(ops, TERMS).acked_back == [(1, True)]


def test_an_acked_message_back_unflagged_after_a_failover_breaks_rules_2_and_3():
    ops = [connect(1, 1, "n1"), *published(2, 1, 1), connect(3, 2, "n1"), *consumed(4, 2, 1),
           connect(13, 3, "n2"), *consumed(14, 3, 1)]
    verdict = check(ops, TERMS)
    assert verdict.acked_back == [(1, False)] and verdict.unflagged_redeliveries == [1]


def test_a_confirm_from_a_node_whose_term_had_ended_is_reported():
    """n1 confirms after etcd showed its lease gone (rule 4), whether no node
    or n2 leads by then."""
    ops = [connect(1, 1, "n1"), *published(2, 1, 1), *published(11, 1, 2), *published(13, 1, 3)]
    assert [c[:3] for c in check(ops, TERMS).foreign_confirms] == [(2, "n1", None), (3, "n1", "n2")]


def test_a_confirm_between_two_polls_that_saw_different_terms_is_not_judged():
    """n2 may have been elected right after the poll that last saw no
    leader: its confirm then is not held against it; nor is an acked
    message n2 delivers again, flagged, before the poll that sees n2."""
    ops = [connect(1, 1, "n1"), connect(1, 2, "n1"), *published(2, 1, 1), *consumed(3, 2, 1), connect(11.85, 3, "n2"),
           *published(11.9, 3, 2), *consumed(11.93, 3, 1, redelivered=True), *consumed(11.96, 3, 2)]
    verdict = check(ops, TERMS)
    assert verdict.ok, verdict.problems()
    assert verdict.acked_back_allowed == 1


def test_a_confirm_retransmitted_after_its_path_was_cut_is_judged_when_the_cut_began():
    """n1 confirmed 1 just as the harness cut the client from it (at 9.5, in
    n1's term); TCP brings the confirm after the mend at 13, in n2's term:
    not n1 confirming in n2's term. The same confirm with no cut, or arriving
    long after the mend, is reported."""
    cut = [Op(9.5, "cut", node="n1"), Op(13.0, "mend", node="n1")]
    late = [connect(1, 1, "n1"), Op(9.4, "send", conn=1, number=1), Op(14.0, "confirm", conn=1, number=1)]
    drained = [connect(20, 2, "n2"), *consumed(21, 2, 1)]
    verdict = check(late + cut + drained, TERMS)
    assert verdict.ok, verdict.problems()
    assert [c[:3] for c in check(late, TERMS).foreign_confirms] == [(1, "n1", "n2")]
    much_later = late[:2] + [Op(25.0, "confirm", conn=1, number=1)]
    assert [c[:3] for c in check(much_later + cut, TERMS).foreign_confirms] == [(1, "n1", "n2")]


def test_an_ack_settled_by_a_reply_retransmitted_after_a_cut_counts_from_the_cut():
    """n1 handled the ack of 1 and sent the settling qos-ok at 9.5, in its
    term, as the harness cut the client from it; the reply arrives after the
    mend at 13, in n2's term, and n2 delivers 1 again, flagged: the failover
    came after the ack was handled (allowed). Without the cut the same
    history breaks rule 2 (no new term between 13.01 and 14)."""
    cut = [Op(9.5, "cut", node="n1"), Op(13.0, "mend", node="n1")]
    acked = [connect(1, 1, "n1"), *published(2, 1, 1), connect(3, 2, "n1"), Op(9.4, "deliver", conn=2, number=1),
             Op(9.41, "ack", conn=2, number=1), Op(13.01, "settle", conn=2), connect(13.5, 3, "n2"),
             *consumed(14, 3, 1, redelivered=True)]
    verdict = check(acked + cut, TERMS)
    assert verdict.ok, verdict.problems()
    assert verdict.acked_back_allowed == 1
    assert check(acked, TERMS).acked_back == [(1, True)]
