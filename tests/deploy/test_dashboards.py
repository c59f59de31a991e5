"""The Grafana dashboards: committed JSON equals the code, queries read real metrics, panels are complete.

Queries are read from the committed JSON (grafana/dashboards), which is what users import; the drift test
keeps it equal to the code. That every query returns data is proven end to end against a real Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support.helpers import ROOT, require_tool

from gpumon.dashboards import (
    ALL_VALUE,
    DASHBOARDS,
    expand,
    metric_names,
    queries,
    rendered,
    uses_rate_interval,
    variable_queries,
)
from gpumon.dashboards.__main__ import main
from gpumon.dashboards.configmaps import CONFIGMAPS_FILE, render_configmaps
from gpumon.metrics import BY_NAME

DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
PROVISIONING = ROOT / "grafana" / "provisioning"
RULES = ROOT / "alerts" / "recording.rules.yml"
MODERN = {"timeseries", "stat", "table", "heatmap", "bargauge", "state-timeline"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
UIDS = {
    "gpumon-node.json": "gpumon-node",
    "gpumon-training.json": "gpumon-training",
    "gpumon-fleet.json": "gpumon-fleet",
}
VARIABLES = {
    "job": "label_values(gpumon_build_info, job)",
    "node": 'label_values(gpumon_node_info{job=~"$job"}, node)',
    "instance": 'label_values(gpumon_node_info{job=~"$job",node=~"$node"}, instance)',
}
EXTRA_VARIABLES = {
    "gpumon-training": {"job_name": 'label_values(gpumon_training_rank_info{job=~"$job"}, job_name)'},
    "gpumon-node": {"gpu": 'label_values(gpumon_gpu_info{job=~"$job",instance=~"$instance"}, gpu)'},
    "gpumon-fleet": {},
}


def committed() -> dict[str, dict]:
    return {name: json.loads((DASHBOARD_DIR / name).read_text()) for name in DASHBOARDS}


def panels() -> list[tuple[str, dict]]:
    return [(model["uid"], p) for model in committed().values() for p in model["panels"]]


def visual_panels() -> list[tuple[str, dict]]:
    return [(uid, p) for uid, p in panels() if p["type"] != "row"]


def all_values(model: dict) -> dict[str, str]:
    return {v["name"]: "$__all" for v in model["templating"]["list"]}


def recording_rules() -> set[str]:
    # the real file, never a copy of its names: a rule renamed or dropped there must fail here
    assert RULES.exists(), f"{RULES} is missing: the dashboards read its recording rules"
    doc = yaml.safe_load(RULES.read_text())
    return {rule["record"] for group in doc["groups"] for rule in group["rules"] if "record" in rule}


def known_series() -> set[str]:
    names = set(BY_NAME) | {"up"}
    for m in BY_NAME.values():
        if m.type == "histogram":
            names |= {m.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        if m.type == "summary":
            names |= {m.name + suffix for suffix in ("_sum", "_count")}
    return names | recording_rules()


# ---- generated, committed, unchanged ------------------------------------------------------------------


def test_committed_json_is_what_the_code_generates() -> None:
    for name, text in rendered().items():
        path = DASHBOARD_DIR / name
        assert path.exists(), f"{path} missing: run python -m gpumon.dashboards"
        assert path.read_text() == text, (
            f"{path} drifted from gpumon/dashboards: run python -m gpumon.dashboards"
        )
    # and the Kubernetes ConfigMaps made of them (deploy/kubernetes/base/dashboards.yaml, the default)
    assert CONFIGMAPS_FILE.read_text() == render_configmaps(rendered())
    assert main(["--check", "--dir", str(DASHBOARD_DIR)]) == 0


def test_check_reports_drift_and_generation_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--dir", str(tmp_path / "json"), "--configmaps", str(tmp_path / "dashboards.yaml")]
    assert main(["--check", *where]) == 1  # nothing written yet
    assert not (tmp_path / "json").exists() and not (tmp_path / "dashboards.yaml").exists()
    assert main(where) == 0
    assert main(["--check", *where]) == 0
    capsys.readouterr()
    edited = tmp_path / "json" / "gpumon-node.json"
    edited.write_text(edited.read_text().replace("GPU utilisation", "GPU usage"))
    assert main(["--check", *where]) == 1
    err = capsys.readouterr().err
    assert "gpumon-node.json" in err and "dashboards.yaml" not in err
    # the ConfigMap manifest is checked too, and regenerated
    assert main(where) == 0
    manifest = tmp_path / "dashboards.yaml"
    manifest.write_text(manifest.read_text().replace("grafana_dashboard", "grafana_dashbord"))
    assert main(["--check", *where]) == 1
    assert "dashboards.yaml" in capsys.readouterr().err
    assert main(where) == 0 and main(["--check", *where]) == 0


def test_output_is_deterministic_with_a_trailing_newline() -> None:
    first, second = rendered(), rendered()
    assert first == second
    for text in first.values():
        assert text.endswith("}\n")
        assert json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n" == text


def test_queries_are_those_of_the_committed_files() -> None:
    assert queries() == queries(DASHBOARD_DIR)
    assert {q.dashboard for q in queries()} == set(UIDS.values())
    targets = sum(len(p.get("targets", [])) for _, p in panels())
    assert len(queries()) == targets


# ---- every query reads something that exists ------------------------------------------------------------


def test_every_metric_is_in_the_registry_or_a_recording_rule() -> None:
    known = known_series()
    unknown = {}
    for q in [*queries(DASHBOARD_DIR), *variable_queries(DASHBOARD_DIR)]:
        names = metric_names(q.expr)
        assert names, f"{q.dashboard} / {q.panel} / {q.ref_id} selects no metric: {q.expr}"
        for name in names - known:
            unknown.setdefault(name, []).append(f"{q.dashboard} / {q.panel} / {q.ref_id}")
    assert not unknown, f"metrics neither in gpumon.metrics nor in {RULES.name}: {unknown}"


def test_metric_names_skips_functions_labels_strings_and_durations() -> None:
    expr = (
        "histogram_quantile(0.9,"
        ' sum by (job_name, le) (rate(a_bucket{x=~"b|c",le!="+Inf"}[$__rate_interval])))'
        " * on(instance, uuid) group_left(name) job:b_c:ratio offset 5m"
        ' or label_replace(vector(0), "dst", "$1", "src", "(.*)") > bool 1e-9 and inf'
    )
    assert metric_names(expr) == {"a_bucket", "job:b_c:ratio"}


# ---- panels are complete ---------------------------------------------------------------------------------


def test_every_panel_has_a_unit_and_a_description() -> None:
    for uid, p in visual_panels():
        where = f"{uid} / {p['title']}"
        assert p["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        assert len(p.get("description", "").strip()) >= 20, f"{where}: no real description"
        assert p["targets"], f"{where}: no query"
    rows = [p for _, p in panels() if p["type"] == "row"]
    assert rows and all(not p["panels"] and "targets" not in p for p in rows)  # layout only


def test_ratios_are_shown_as_percent() -> None:
    """A panel whose queries all read 0-1 ratios from the registry shows them in percentunit."""
    for uid, p in visual_panels():
        if p["type"] == "table":
            continue  # per-column units (overrides)
        names = set().union(*(metric_names(t["expr"]) for t in p["targets"]))
        if names and all(n in BY_NAME and BY_NAME[n].unit == "ratio" for n in names):
            assert p["fieldConfig"]["defaults"]["unit"] == "percentunit", f"{uid} / {p['title']}"


def test_panel_types_are_modern() -> None:
    used = {p["type"] for _, p in visual_panels()}
    assert used <= MODERN, used - MODERN
    assert {"timeseries", "stat", "table", "heatmap"} <= used


def test_step_time_heatmap_reads_the_histogram_buckets() -> None:
    heatmaps = [p for uid, p in visual_panels() if uid == "gpumon-training" and p["type"] == "heatmap"]
    assert any(
        t["format"] == "heatmap" and "gpumon_training_job_step_duration_seconds_bucket" in t["expr"]
        for p in heatmaps
        for t in p["targets"]
    )


def test_every_rate_uses_rate_interval() -> None:
    assert not uses_rate_interval("rate(a[5m])")
    assert not uses_rate_interval("rate(a[$__rate_interval]) + increase(b[1h])")
    assert uses_rate_interval('sum(irate(a{b=~"$c"}[$__rate_interval])) / 2')
    for q in queries(DASHBOARD_DIR):
        assert uses_rate_interval(q.expr), f"{q.dashboard} / {q.panel} / {q.ref_id}: {q.expr}"


def test_every_panel_and_query_uses_the_datasource_variable() -> None:
    for uid, p in visual_panels():
        assert p["datasource"] == DATASOURCE, f"{uid} / {p['title']}"
        assert all(t["datasource"] == DATASOURCE for t in p["targets"]), f"{uid} / {p['title']}"
    for model in committed().values():
        for v in model["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"] == DATASOURCE, f"{model['uid']}: ${v['name']}"


def test_variables() -> None:
    for name, model in committed().items():
        uid = UIDS[name]
        variables = {v["name"]: v for v in model["templating"]["list"]}
        ds = variables["datasource"]
        assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
        for var, definition in {**VARIABLES, **EXTRA_VARIABLES[uid]}.items():
            v = variables[var]
            assert (v["type"], v["definition"], v["query"]) == ("query", definition, definition), (
                f"{uid}: {var}"
            )
            assert v["multi"] and v["includeAll"] and v["allValue"] == ALL_VALUE
        # every reference resolves: expand() raises KeyError on a variable the dashboard does not define
        for q in queries(DASHBOARD_DIR):
            if q.dashboard == uid:
                expand(q.expr, all_values(model))


def test_uids_ids_and_titles_are_unique() -> None:
    models = committed()
    assert {name: m["uid"] for name, m in models.items()} == UIDS
    for model in models.values():
        ids = [p["id"] for p in model["panels"]]
        titles = [p["title"] for p in model["panels"] if p["type"] != "row"]
        assert len(ids) == len(set(ids)), model["uid"]
        assert len(titles) == len(set(titles)), f"{model['uid']}: queries() names panels by title"
        refs = [[t["refId"] for t in p.get("targets", [])] for p in model["panels"]]
        assert all(len(r) == len(set(r)) for r in refs)


def test_grid_positions_fit_and_do_not_overlap() -> None:
    for model in committed().values():
        taken: dict[tuple[int, int], str] = {}
        for p in model["panels"]:
            g = p["gridPos"]
            assert g["w"] >= 1 and g["h"] >= 1 and g["x"] >= 0 and g["y"] >= 0
            assert g["x"] + g["w"] <= 24, f"{model['uid']} / {p['title']}: past column 24"
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in taken, f"{model['uid']}: {p['title']} overlaps {taken[(x, y)]}"
                    taken[(x, y)] = p["title"]


# ---- expand() ------------------------------------------------------------------------------------------


def test_expand_substitutes_like_grafana() -> None:
    expr = 'rate(a{job=~"$job",instance=~"${instance}",x="[[x]]"}[$__rate_interval]) offset $__range'
    out = expand(expr, {"job": "$__all", "instance": "10.0.0.1:9478", "x": "plain"}, "2m", range_="6h")
    assert out == r'rate(a{job=~".*",instance=~"10\\.0\\.0\\.1:9478",x="plain"}[2m]) offset 6h'
    assert expand('a{b=~"$job_name"}', {"job_name": ["x", "y.z"], "job": "no"}) == r'a{b=~"(x|y\\.z)"}'
    assert expand('a{b=~"$v"}', {"v": "All"}) == 'a{b=~".*"}'
    assert expand("${v:regex} ${v:pipe} ${v:csv}", {"v": ["a.b", "c"]}) == r"(a\.b|c) a.b|c a.b,c"
    assert (
        expand("[$__interval] $__interval_ms $__range_s", {}, interval="30s", range_="1h")
        == "[30s] 30000 3600"
    )
    with pytest.raises(KeyError):
        expand('a{b=~"$missing"}', {"job": "x"})
    with pytest.raises(ValueError):
        expand("${v:unknownformat}", {"v": "x"})


def test_variable_queries_cover_every_query_variable() -> None:
    got = {(q.dashboard, q.panel): q.expr for q in variable_queries(DASHBOARD_DIR)}
    assert (
        got[("gpumon-node", "instance")]
        == 'count by (instance) (gpumon_node_info{job=~"$job",node=~"$node"})'
    )
    for name, model in committed().items():
        names = {v["name"] for v in model["templating"]["list"] if v["type"] == "query"}
        assert {panel for uid, panel in got if uid == UIDS[name]} == names


# ---- promtool parses every expression --------------------------------------------------------------------


def test_promtool_parses_every_expanded_query(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    models = {m["uid"]: m for m in committed().values()}
    specific = {"job": "gpumon", "node": ["a.example", "b"], "instance": "10.0.0.1:9478", "gpu": "0"}
    specific["job_name"] = "llama-70b"
    rules = []
    for q in [*queries(DASHBOARD_DIR), *variable_queries(DASHBOARD_DIR)]:
        for values in (all_values(models[q.dashboard]), specific):
            rules.append({"record": f"dashboard_query_{len(rules)}", "expr": expand(q.expr, values, "1m")})
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout


def panel_query(uid: str, title: str, ref_id: str = "A", **values: str) -> str:
    """A panel's query as Grafana sends it, every variable All unless given."""
    models = {m["uid"]: m for m in committed().values()}
    (q,) = [q for q in queries(DASHBOARD_DIR) if (q.dashboard, q.panel, q.ref_id) == (uid, title, ref_id)]
    return expand(q.expr, {**all_values(models[uid]), **values}, "1m")


def test_queries_mean_what_their_panels_say(tmp_path: Path) -> None:
    """Queries whose meaning is easy to get wrong, evaluated by promtool on hand-made series at 60m."""
    promtool = require_tool("promtool")
    a, b, c = (
        'job="gpumon",instance="a:9478"',
        'job="gpumon",instance="b:9478"',
        'job="gpumon",instance="c:9478"',
    )
    other = 'job="other",instance="d:9478"'
    xid74 = 'xid="74",severity="critical"'
    jv = 'job_name="j",via="device"'
    series = {
        # a gpumon job whose exporters all went down at 30m (their build info is stale by 60m), one all up
        'up{job="down",instance="x:9478"}': "1x30 0x30",
        'up{job="down",instance="y:9478"}': "1x30 0x30",
        'gpumon_build_info{job="down",instance="x:9478",version="1"}': "1x30",
        'gpumon_build_info{job="down",instance="y:9478",version="1"}': "1x30",
        f"up{{{a}}}": "1x60",
        f"up{{{b}}}": "1x60",
        f"up{{{c}}}": "1x60",
        f'gpumon_build_info{{{a},version="1"}}': "1x60",
        f'gpumon_build_info{{{b},version="2"}}': "1x60",
        f'gpumon_build_info{{{c},version="2"}}': "1x60",
        f"up{{{other}}}": "1x60",
        # nodes a and b in scrape job gpumon, d in another; c's exporter is up but is not in the rules yet
        f'gpumon_node_info{{{a},node="node-a"}}': "1x60",
        f'gpumon_node_info{{{b},node="node-b"}}': "1x60",
        f'gpumon_node_info{{{other},node="node-d"}}': "1x60",
        'instance:gpumon_gpus:count{instance="a:9478"}': "8x60",
        'instance:gpumon_gpus:count{instance="b:9478"}': "8x60",
        'instance:gpumon_gpus:count{instance="d:9478"}': "4x60",
        'instance:gpumon_gpus_up:sum{instance="a:9478"}': "7x60",
        'instance:gpumon_gpus_up:sum{instance="b:9478"}': "8x60",
        'instance:gpumon_gpus_up:sum{instance="d:9478"}': "0x60",
        # XID 74 on both nodes, whose gpumon versions word it differently; node b also scraped twice
        f'gpumon_gpu_xid_errors_total{{{a},gpu="6",uuid="GPU-a6",xid="74"}}': "1x60",
        f'gpumon_gpu_xid_errors_total{{{b},gpu="2",uuid="GPU-b2",xid="74"}}': "3x60",
        f'gpumon_xid_info{{{a},{xid74},description="NVLink error",action="reset"}}': "1x60",
        f'gpumon_xid_info{{{b},{xid74},description="NVLink Error",action="drain"}}': "1x60",
        f'gpumon_xid_info{{{b.replace("gpumon", "twice")},{xid74},description="NVLink",action="x"}}': "1x60",
        # a job whose slowest rank (1.2 s, node b) is not on its slowest node (a: two ranks of 1 s steps,
        # mean 1.0 s; b: 50 steps of 1.2 s and 300 of 0.2 s a minute, mean 0.34 s), from each node's
        # job histogram
        f'gpumon_training_job_step_duration_seconds_count{{{a},job_name="j"}}': "0+120x60",
        f'gpumon_training_job_step_duration_seconds_sum{{{a},job_name="j"}}': "0+120x60",
        f'gpumon_training_job_step_duration_seconds_count{{{b},job_name="j"}}': "0+350x60",
        f'gpumon_training_job_step_duration_seconds_sum{{{b},job_name="j"}}': "0+120x60",
        # node a's two NDR ports (50 GB/s): mlx5_0 receives 25 GB/s and sends 10, mlx5_1 receives 5 and
        # sends 40 and is down; rank 0 of job j runs on GPU 0 (nearest mlx5_0), rank 1 on GPU 1 (mlx5_1)
        **{
            f'gpumon_nic_{d}_bytes_total{{{a},device="mlx5_{n}",port="1"}}': f"0+{int(rate * 60)}x60"
            for n, d, rate in (
                (0, "receive", 25e9),
                (0, "transmit", 10e9),
                (1, "receive", 5e9),
                (1, "transmit", 40e9),
            )
        },
        f'gpumon_nic_link_speed_bytes_per_second{{{a},device="mlx5_0",port="1"}}': "50000000000x60",
        f'gpumon_nic_link_speed_bytes_per_second{{{a},device="mlx5_1",port="1"}}': "50000000000x60",
        f'gpumon_nic_up{{{a},device="mlx5_0",port="1"}}': "1x60",
        f'gpumon_nic_up{{{a},device="mlx5_1",port="1"}}': "0x60",
        f'gpumon_gpu_nic_affinity_info{{{a},gpu="0",uuid="GPU-a0",device="mlx5_0",path="PIX"}}': "1x60",
        f'gpumon_gpu_nic_affinity_info{{{a},gpu="1",uuid="GPU-a1",device="mlx5_1",path="PIX"}}': "1x60",
        **{
            f'gpumon_training_rank_gpu_info{{{a},{jv},rank="{n}",gpu="{n}",uuid="GPU-a{n}"}}': "1x60"
            for n in (0, 1)
        },
        'instance:gpumon_node:info{instance="a:9478",node="node-a"}': "1x60",
        # node a's management interface: 2 MB/s in, 1 MB/s out
        f'gpumon_ethernet_receive_bytes_total{{{a},interface="eth0"}}': f"0+{int(2e6 * 60)}x60",
        f'gpumon_ethernet_transmit_bytes_total{{{a},interface="eth0"}}': f"0+{int(1e6 * 60)}x60",
        # NCCL on node a: two processes of job j, AllReduce at 20 and 60 GB/s for 0.5 and 0.25 s a second
        # (time-weighted: (10 + 15) / 0.75 = 33.3 GB/s), and AllGather at 80 GB/s
        **{
            f'gpumon_training_nccl_{name}_total{{{a},job_name="j",operation="{op}"}}': f"0+{per_minute:g}x60"
            for name, op, per_minute in (
                ("bus_bytes", "AllReduce", 60 * (0.5 * 20e9 + 0.25 * 60e9)),
                ("seconds", "AllReduce", 60 * 0.75),
                ("bus_bytes", "AllGather", 60 * 0.1 * 80e9),
                ("seconds", "AllGather", 60 * 0.1),
            )
        },
    }
    fleet, training, node = "gpumon-fleet", "gpumon-training", "gpumon-node"
    nic_use = panel_query(training, "NIC use of the job's ranks", job_name="j")
    nccl = panel_query(training, "NCCL bus bandwidth", job_name="j")
    expected = [
        (panel_query(fleet, "Exporters down"), {}, 2),
        (panel_query(fleet, "Exporters down", job="gpumon"), {}, 0),  # all up: 0, not no data
        (panel_query(fleet, "GPUs", job="gpumon"), {}, 16),
        (panel_query(fleet, "GPUs down", job="gpumon"), {}, 1),
        (panel_query(fleet, "GPUs down", job="other"), {}, 4),
        (f"count({panel_query(fleet, 'XID errors by node and code')})", {}, 2),
        (f"sum({panel_query(fleet, 'XID errors by node and code')})", {}, 4),
        (f"count({panel_query(node, 'XID errors')})", {}, 2),
        (panel_query(training, "Step time vs baseline", "B"), {"job_name": "j"}, 1.0),
        # each rank's nearest NIC, its busier direction: 0.5 (mlx5_0 receiving) and 0.8 (mlx5_1 sending)
        (f"sum({nic_use})", {}, 1.3),
        (f"max({nic_use})", {}, 0.8),
        (f"max({panel_query(node, 'NIC throughput, of line rate', 'B')})", {}, 0.8),
        (f"sum({panel_query(node, 'NIC throughput')})", {}, 30e9),
        # no error counted: 0 per port, not no data
        (f"count({panel_query(node, 'NIC errors')})", {}, 2),
        (panel_query(node, "NIC ports up"), {"instance": "a:9478"}, 0.5),
        (f"count({panel_query(node, 'Nearest NIC of each GPU')})", {}, 2),
        (f"sum({panel_query(node, 'Ethernet throughput')})", {}, 2e6),
        (f"sum({panel_query(node, 'Ethernet throughput', 'B')})", {}, 1e6),
        (f"min({nccl})", {}, 25e9 / 0.75),
        (f"max({nccl})", {}, 80e9),
    ]
    tests = [
        {
            "expr": expr,
            "eval_time": "60m",
            "exp_samples": [
                {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}
            ],
        }
        for expr, labels, value in expected
    ]
    (tmp_path / "none.rules.yml").write_text("groups: []\n")
    doc = {
        "rule_files": ["none.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "dashboards.test.yml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- provisioning ----------------------------------------------------------------------------------------


def test_dashboard_provisioning_points_at_the_mounted_json() -> None:
    doc = yaml.safe_load((PROVISIONING / "dashboards" / "gpumon.yaml").read_text())
    assert doc["apiVersion"] == 1
    (provider,) = doc["providers"]
    assert provider["type"] == "file" and provider["folder"]
    path = provider["options"]["path"]
    readme = (ROOT / "grafana" / "README.md").read_text()
    # the README's docker example mounts grafana/dashboards exactly where the provider reads
    assert re.search(rf"grafana/dashboards:{re.escape(path)}\b", readme), path
    assert "python -m gpumon.dashboards" in readme


def test_datasource_provisioning_is_prometheus() -> None:
    doc = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert doc["apiVersion"] == 1
    (ds,) = doc["datasources"]
    # the dashboards' datasource variable lists data sources of this type
    assert ds["type"] == "prometheus" and ds["url"].startswith("http")
    assert re.fullmatch(r"\d+s", ds["jsonData"]["timeInterval"])  # $__rate_interval is derived from it
