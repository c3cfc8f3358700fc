import pytest

from grpo_jax.sweep import spec


def test_grid_is_a_cartesian_product_times_seeds():
  members = spec.grid(spec.axis("algo.advantage", ["grpo", "rloo"]),
                      spec.axis("algo.aggregation", {"tm": "token_mean", "smtm": "seq_mean_token_mean"}),
                      seeds=[0, 1, 2], prefix="v", common={"train.num_steps": 50})
  assert len(members) == 2 * 2 * 3
  names = [m["name"] for m in members]
  assert names[:4] == ["v_grpo_tm_seed0", "v_grpo_tm_seed1", "v_grpo_tm_seed2", "v_grpo_smtm_seed0"]
  assert len(set(names)) == len(names)
  last = members[-1]
  assert last["group"] == "v_rloo_smtm"
  assert last["overrides"] == {"train.num_steps": 50, "algo.advantage": "rloo",
                               "algo.aggregation": "seq_mean_token_mean", "seed": 2}


def test_variants_set_several_keys_and_custom_seed_key():
  members = spec.grid(spec.variants({"dapo": {"algo.beta": 0.0, "algo.epsilon_high": 0.28}}), seeds=[7],
                      seed_key="train.seed")
  assert members == [{"name": "dapo_seed7", "group": "dapo",
                      "overrides": {"algo.beta": 0.0, "algo.epsilon_high": 0.28, "train.seed": 7}}]


def test_grid_rejects_keys_set_twice():
  with pytest.raises(ValueError, match="algo.beta"):
    spec.grid(spec.axis("algo.beta", [0.0]), spec.variants({"dapo": {"algo.beta": 0.0}}))
  with pytest.raises(ValueError, match="seeds=...") :
    spec.grid(spec.axis("seed", [1]))


@pytest.mark.parametrize("raw, match", [
    ({}, "list of member dicts"),
    ([], "no members"),
    ([{"name": "a b"}], "name 'a b'"),
    ([{"name": "a"}, {"name": "a"}], "appears twice"),
    ([{"name": "a", "overrides": {"algo..beta": 1}}], "dotted config path"),
    ([{"name": "a", "overrides": {"algo.beta": None}}], "algo.beta=None has type NoneType"),
    ([{"name": "a", "extra": 1}], "unknown fields \\['extra'\\]"),
])
def test_validate_names_the_problem(raw, match):
  with pytest.raises((ValueError, TypeError), match=match):
    spec.validate(raw)


def test_validate_default_group_strips_seed():
  (m,) = spec.validate([{"name": "grpo_tm_seed12", "overrides": {"seed": 12}}])
  assert m.group == "grpo_tm" and m.overrides == {"seed": 12}


def test_load_sweep_and_select(experiment_file):
  members = spec.load_sweep(experiment_file + ":some_preset")
  assert [m.name for m in members] == ["grpo_seed0", "grpo_seed1", "rloo_seed0", "rloo_seed1", "broken"]
  assert [m.name for m in spec.select(members, "seed1")] == ["grpo_seed1", "rloo_seed1"]
  with pytest.raises(ValueError, match="matches none"):
    spec.select(members, "dapo")


def test_train_command_formats_values_for_ml_collections():
  argv = spec.train_command(["python", "scripts/train.py"], "experiments/x.py:tiny", "runs/s/a",
                            {"algo.beta": 0.04, "algo.use_ref": False, "seed": 3, "algo.advantage": "dr_grpo",
                             "optim.lr": 1e-6})
  assert argv == ["python", "scripts/train.py", "--config", "experiments/x.py:tiny", "--workdir", "runs/s/a",
                  "--config.algo.beta=0.04", "--config.algo.use_ref=false", "--config.seed=3",
                  "--config.algo.advantage=dr_grpo", "--config.optim.lr=1e-06"]


def test_merge_overrides_rejects_clash():
  (m,) = spec.validate([{"name": "a", "overrides": {"seed": 1}}])
  assert spec.merge_overrides({"train.num_steps": 5}, m) == {"train.num_steps": 5, "seed": 1}
  with pytest.raises(ValueError, match="clashes"):
    spec.merge_overrides({"seed": 2}, m)


def test_order_by_seed_and_share_warm_start():
  members = spec.grid(spec.axis("algo.advantage", ["grpo", "rloo"]), seeds=[0, 1])
  members += spec.grid(spec.variants({"kl": {"algo.beta": 0.04}}), seeds=[0, 1])
  shared = spec.order_by_seed(spec.share_warm_start(members, donor_group="rloo", exclude=["kl"]))
  assert [(m["name"], m.get("init_from")) for m in shared] == [
      ("rloo_seed0", None), ("grpo_seed0", "rloo_seed0"), ("kl_seed0", None),
      ("rloo_seed1", None), ("grpo_seed1", "rloo_seed1"), ("kl_seed1", None)]
  validated = spec.validate(shared)
  assert validated[1].init_from == "rloo_seed0" and validated[1].to_json()["init_from"] == "rloo_seed0"
  with pytest.raises(ValueError, match="no member is in donor group 'dapo'"):
    spec.share_warm_start(members, donor_group="dapo")
  with pytest.raises(ValueError, match="has no donor in group 'kl' with seed 1"):
    spec.share_warm_start(members[:3] + members[4:5], donor_group="kl")


def test_init_from_must_name_an_earlier_member():
  with pytest.raises(ValueError, match="init_from='b' is not the name of an earlier member"):
    spec.validate([{"name": "a", "init_from": "b"}, {"name": "b"}])
  with pytest.raises(ValueError, match="init_from='a'"):
    spec.validate([{"name": "a", "init_from": "a"}])


def test_check_keys_exist_names_the_bad_key():
  config = {"seed": 0, "grpo": {"beta": 0.0, "advantage": "grpo", "epsilon_high": None, "dynamic": False}}
  spec.check_keys_exist(config, {"grpo.beta": 0.04, "grpo.epsilon_high": 0.28, "seed": 3, "grpo.dynamic": True},
                        "m")
  with pytest.raises(KeyError, match="override 'grpo.betta': grpo has no field 'betta'"):
    spec.check_keys_exist(config, {"grpo.betta": 0.0}, "m")
  with pytest.raises(KeyError, match="the config has no field 'algo'"):
    spec.check_keys_exist(config, {"algo.beta": 0.0}, "m")
  with pytest.raises(TypeError, match="grpo.beta='0' is a str, but the field is a number"):
    spec.check_keys_exist(config, {"grpo.beta": "0"}, "m")
  with pytest.raises(TypeError, match="is a number, but the field is a bool"):
    spec.check_keys_exist(config, {"grpo.dynamic": 1}, "m")


def test_load_sweep_checks_keys_against_get_config(tmp_path, experiment_file):
  assert len(spec.load_sweep(experiment_file, check_keys=True)) == 5
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(preset=None):\n  return {'seed': 0}\n"
                 "def get_sweep():\n  return [{'name': 'a', 'overrides': {'sead': 1}}]\n")
  with pytest.raises(KeyError, match="sweep member 'a': override 'sead'"):
    spec.load_sweep(str(bad), check_keys=True)
  assert spec.load_sweep(str(bad))[0].overrides == {"sead": 1}
  with pytest.raises(FileNotFoundError, match="does not exist"):
    spec.load_sweep(str(tmp_path / "missing.py"))


def test_the_study_file_expands_to_valid_members():
  from tests.sweep.conftest import REPO
  members = spec.load_sweep(f"{REPO}/experiments/ablation_variants.py", check_keys=True)
  groups = {}
  for m in members:
    groups.setdefault(m.group, []).append(m)
  assert len(groups) == 13 and len(members) == 12 * 4 + 1
  names = [m.name for m in members]
  for m in members:
    if m.group in ("grpo_smtm", "grpo_smtm_kl0.04"):
      assert m.init_from is None
    else:  # shares the warm start of the baseline member with its seed, which runs before it
      assert m.init_from == f"grpo_smtm_seed{spec.seed_of(m.name)}"
      assert names.index(m.init_from) < names.index(m.name)


def test_the_lora_comparison_expands_to_valid_members_sharing_the_full_runs_warm_start():
  from tests.sweep.conftest import REPO
  members = spec.load_sweep(f"{REPO}/experiments/lora.py", check_keys=True)
  assert sorted({m.group for m in members}) == ["full", "lora_r1", "lora_r8"] and len(members) == 9
  names = [m.name for m in members]
  for m in members:
    if m.group == "full":
      assert m.init_from is None and m.overrides["model.lora_rank"] == 0
    else:
      assert m.init_from == f"full_seed{spec.seed_of(m.name)}" and names.index(m.init_from) < names.index(m.name)
