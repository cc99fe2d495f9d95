"""Session retention policy without a server: which nodes are retained, the eviction order it imposes,
the wall-clock window, and the flag's value checks."""

import heapq

import pytest

from sglang_ext.sessions.policy import (
    AccessClock,
    RetentionConfigError,
    RetentionEvictionStrategy,
    SessionRetentionPolicy,
    mark_reused,
    move_retained_to_mru,
    parse_retention_seconds,
)


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Node:
    """The attributes of SGLang's UnifiedTreeNode the policy reads."""

    def __init__(self, parent=None, tokens=10):
        self.parent, self.children, self.key = parent, {}, [0] * tokens
        self.last_access_time = 0.0
        if parent is not None:
            parent.children[id(self)] = self


class Tree:
    """A radix tree with SGLang's access counter, touched through a policy's clock like the cache does."""

    def __init__(self, policy):
        self.policy, self.counter, self.root = policy, 0.0, Node()

    def touch(self, *nodes):
        self.counter += 1  # the cache marks with a fresh counter value (get_and_increase_time_counter)
        self.policy.clock.mark(self.counter)
        for node in nodes:
            self.counter += 1
            node.last_access_time = self.counter

    def match(self, node):
        """A request matched the path ending at `node` (SGLang touches the path, the cache marks it reused)."""
        path = []
        while node is not self.root:
            path.append(node)
            node = node.parent
        self.touch(*reversed(path))
        mark_reused(path[0], self.root)


def _policy(seconds=60.0):
    clock = FakeClock()
    policy = SessionRetentionPolicy(seconds)
    policy.clock.now = clock
    return policy, clock


def _eviction_order(policy, root, leaves, inner):
    strategy = RetentionEvictionStrategy(inner, policy, lambda: root)
    heap = [(strategy.get_priority(n), i, n) for i, n in enumerate(leaves)]
    heapq.heapify(heap)
    return [heapq.heappop(heap)[2] for _ in range(len(heap))]


class LRU:
    def get_priority(self, node):
        return node.last_access_time


def test_reused_prefix_and_its_newest_turn_are_retained_one_off_prompts_are_not():
    policy, clock = _policy()
    tree = Tree(policy)
    system = Node(tree.root, 100)
    turn1 = Node(system, 40)
    tree.touch(system, turn1)  # session A, turn 1 inserted
    tree.match(turn1)  # turn 2 arrives and matches system + turn 1
    turn2 = Node(turn1, 30)
    tree.touch(turn2)  # turn 2's prompt, then its generated tail below it
    turn2_tail = Node(turn2, 15)
    tree.touch(turn2_tail)
    stub = Node(turn1, 1)  # an older sibling (e.g. where the re-rendered prompt diverged)
    stub.last_access_time = turn1.last_access_time - 0.5
    one_off = Node(tree.root, 500)
    tree.touch(one_off)  # a prompt nobody reuses
    r = tree.root
    assert policy.retained(system, r) and policy.retained(turn1, r)  # reused
    assert policy.retained(turn2, r) and policy.retained(turn2_tail, r)  # newest branch: the latest turn
    assert not policy.retained(stub, r)
    assert not policy.retained(one_off, r)
    assert policy.retained_tokens(r) == 185


def test_only_the_newest_child_of_a_reused_node_is_retained():
    """A shared system prompt is reused by every request; one-off prompts under it are not all retained."""
    policy, clock = _policy()
    tree = Tree(policy)
    system = Node(tree.root, 100)
    tree.touch(system)
    tree.match(system)
    old, new = Node(system), Node(system)
    tree.touch(old)
    tree.touch(new)
    assert not policy.retained(old, tree.root) and policy.retained(new, tree.root)


def test_retention_expires_after_the_window():
    policy, clock = _policy(seconds=60)
    tree = Tree(policy)
    a = Node(tree.root)
    tree.touch(a)
    tree.match(a)
    clock.t += 59
    assert policy.retained(a, tree.root)
    clock.t += 2
    tree.touch(Node(tree.root))  # other traffic moves the clock on
    assert not policy.retained(a, tree.root)


def test_eviction_order_retained_last_inner_policy_inside_each_class():
    policy, clock = _policy()
    tree = Tree(policy)
    s1, s2 = Node(tree.root), Node(tree.root)
    tree.touch(s1, s2)
    tree.match(s1)
    tree.match(s2)
    others = [Node(tree.root) for _ in range(3)]
    for o in others:
        tree.touch(o)  # newer than both sessions
    order = _eviction_order(policy, tree.root, [s2, others[2], s1, others[0], others[1]], LRU())
    # Without retention LRU would evict s1 and s2 first; with it they go last, still oldest-first between them.
    assert order == [others[0], others[1], others[2], s1, s2]
    plain = sorted([s2, others[2], s1, others[0], others[1]], key=LRU().get_priority)
    assert plain[:2] == [s1, s2]


def test_expired_sessions_fall_back_to_the_inner_order():
    policy, clock = _policy(seconds=10)
    tree = Tree(policy)
    s = Node(tree.root)
    tree.touch(s)
    tree.match(s)
    clock.t += 30
    o = Node(tree.root)
    tree.touch(o)
    assert _eviction_order(policy, tree.root, [o, s], LRU()) == [s, o]


class StateLRU:
    """SGLang's per-component LRU list as the retention cache uses it: `cache` {id: node}, `reset_node_mru`;
    its eviction walk starts at the least recently used end (`order[0]`)."""

    def __init__(self, nodes):
        self.order = sorted(nodes, key=lambda n: n.last_access_time)
        self.cache = {id(n): n for n in reversed(self.order)}  # insertion order unlike the LRU order

    def reset_node_mru(self, node):
        self.order.remove(node)
        self.order.append(node)


def test_recurrent_state_lru_puts_retained_nodes_last_in_their_own_order():
    """Hybrid trees evict recurrent states from their own LRU list: retained nodes move to its used end."""
    policy, clock = _policy()
    tree = Tree(policy)
    s1, s2 = Node(tree.root), Node(tree.root)
    tree.touch(s1, s2)
    tree.match(s1)
    tree.match(s2)
    others = [Node(tree.root) for _ in range(3)]
    for o in others:
        tree.touch(o)
    lru = StateLRU([s1, s2, *others])
    assert lru.order[:2] == [s1, s2]  # plain LRU: the sessions' states would go first
    moved = move_retained_to_mru(lru, lambda n: policy.retained(n, tree.root))
    assert moved == 2
    assert lru.order == [*others, s1, s2]
    clock.t += 120  # the window passed: nothing is retained, nothing moves
    tree.touch(Node(tree.root))
    assert move_retained_to_mru(lru, lambda n: policy.retained(n, tree.root)) == 0


def test_access_clock_dates_counters_and_forgets_old_marks():
    clock = FakeClock()
    ac = AccessClock(10, now=clock)
    for counter in range(0, 100, 10):
        ac.mark(float(counter))
        clock.t += 5
    # marks at t=1000..1045; now=1050; counter 95 was touched after the mark at 90 (t=1045)
    assert ac.wall_time(95.0) == 1045.0
    assert ac.is_recent(95.0) and not ac.is_recent(50.0)
    assert len(ac) <= 4  # marks older than the window are dropped but one
    with pytest.raises(ValueError):
        ac.mark(1.0)


@pytest.mark.parametrize("text", ["-1", "nan", "inf", "ten", ""])
def test_bad_flag_values_are_refused(text):
    with pytest.raises(RetentionConfigError, match="--session-retention-seconds"):
        parse_retention_seconds(text)


def test_flag_values():
    assert parse_retention_seconds("0") == 0.0
    assert parse_retention_seconds("90.5") == 90.5
    with pytest.raises(RetentionConfigError):
        SessionRetentionPolicy(0)
