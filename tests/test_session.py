"""The session on a real local Monarch mesh (generator, trainer, reward actors in their own procs)."""


def test_rollout_is_p_prompts_by_g_samples_with_provenance(session):
    r = session.rollout()
    cfg = session.config.algorithm
    assert len(r.episodes) == cfg.prompts_per_step * cfg.group_size
    groups = {}
    for e in r.episodes:
        groups.setdefault(e.group_id, []).append(e)
        assert len(e.logprobs) == len(e.completion_ids) >= 1
        assert e.policy_version == r.policy_version
        assert e.reward in (0.0, 1.0)
    assert [len(g) for g in groups.values()] == [cfg.group_size] * cfg.prompts_per_step
    for g in groups.values():  # group-relative advantages sum to ~0 within each group
        assert abs(sum(e.advantage for e in g)) < 1e-4
    df = r.to_pandas()
    assert {"prompt", "completion", "target", "reward", "advantage", "policy_version", "reward_version"} <= set(df)
    assert len(df) == len(r.episodes)


def test_generator_logprobs_agree_with_trainer_recompute_at_the_same_version(session):
    session.step(1)  # both sides at the same new version
    r = session.rollout()
    versions = session.checksums()
    assert versions["trainer"][0] == versions["generator"][0] == r.policy_version
    recomputed = session.fleet.trainer.logprobs.call_one(
        [e.prompt_ids for e in r.episodes], [e.completion_ids for e in r.episodes]
    ).get()
    diff = max(abs(a - b) for e, lps in zip(r.episodes, recomputed) for a, b in zip(e.logprobs, lps))
    assert diff < 1e-4, f"max abs logprob difference {diff}"


def test_train_then_sync_makes_generator_weights_equal_the_trainers(session):
    before = session.checksums()
    metrics = session.train(session.rollout())
    assert metrics["policy_version"] == before["trainer"][0] + 1
    mid = session.checksums()
    assert mid["generator"] == before["generator"]  # nothing moves until sync
    assert session.checksums("generator") == {"generator": mid["generator"]}  # the trainer's not read
    assert mid["trainer"][1] != before["trainer"][1]
    report = session.sync()
    assert report["version"] == before["generator"][0] + 1 and not report["skipped"]
    assert report["bytes"] > 1_000_000 and report["gbps"] > 0
    after = session.checksums()
    assert after["generator"] == after["trainer"] == mid["trainer"]


def test_sync_of_an_unchanged_version_moves_nothing(session):
    session.sync()
    report = session.sync()
    assert report["skipped"] and report["bytes"] == 0


def test_step_returns_one_row_per_step_and_feeds_the_metrics_stream(session):
    start = session.step_count
    df = session.step(2)
    assert list(df.index) == [start + 1, start + 2]
    assert {"mean_reward", "accuracy", "tokens_per_s", "generate_s", "train_s", "refresh_gbps"} <= set(df.columns)
    # What a researcher reads of the update (NaN only for a step that had nothing to train on).
    trained = df[df.loss != 0]
    assert (trained.entropy > 0).all() and (trained.clip_fraction == 0).all()  # sync: on-policy
    assert (df.response_length <= df.response_length_max).all() and df.kl_ref.isna().all()  # no reference here
    kinds = set(session.metrics.kind)
    assert {"rollout", "train", "sync", "step"} <= kinds
    status = session.status()
    assert status["up"] and status["policy_version"]["trainer"] == status["policy_version"]["generator"]
