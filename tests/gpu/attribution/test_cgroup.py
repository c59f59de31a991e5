"""parse_cgroup over real /proc/<pid>/cgroup contents collected from public bug reports, tests and docs.

SAMPLES is a list of blocks. ``#`` lines say where the sample was found ("path only": the source gave the
path, from systemctl, systemd-cgls or a log, and the ``hierarchy:controllers:`` prefix is ours). The ``==``
line names the case and what parse_cgroup must return: container id (its first 12 characters, docker-style),
runtime, pod UID and Slurm job, ``-`` for None. The lines after it are the file, verbatim (sometimes only
some of its lines).
"""

from __future__ import annotations

import random

import pytest

from gpumon.gpu.attribution.cgroup import CgroupOwner, parse_cgroup, parse_path

SAMPLES = r"""
# --- Kubernetes, cgroupfs driver: below a pod docker and containerd look the same, so no runtime ---
# coroot/coroot-node-agent cgroup/fixtures/proc/300/cgroup
== burstable v1 | 17db96a24ae1 - 6a4ce4a0-ba47-11ea-b2a7-0cc47ac5979e -
11:devices:/kubepods/burstable/pod6a4ce4a0-ba47-11ea-b2a7-0cc47ac5979e/17db96a24ae1e9dd57143e62b1cb0d2d35e693c65c774c7470e87b0572e07c1a
10:memory:/kubepods/burstable/pod6a4ce4a0-ba47-11ea-b2a7-0cc47ac5979e/17db96a24ae1e9dd57143e62b1cb0d2d35e693c65c774c7470e87b0572e07c1a
3:cpu,cpuacct:/kubepods/burstable/pod6a4ce4a0-ba47-11ea-b2a7-0cc47ac5979e/17db96a24ae1e9dd57143e62b1cb0d2d35e693c65c774c7470e87b0572e07c1a
1:name=systemd:/kubepods/burstable/pod6a4ce4a0-ba47-11ea-b2a7-0cc47ac5979e/17db96a24ae1e9dd57143e62b1cb0d2d35e693c65c774c7470e87b0572e07c1a
# coroot/coroot-node-agent cgroup/fixtures/proc/2000/cgroup: hybrid, the v2 line is the runtime's service
== burstable hybrid | 95cbe853416f - 8833712d-6e69-4f5c-95f3-aebd020ce2e7 -
13:cpuset:/kubepods/burstable/pod8833712d-6e69-4f5c-95f3-aebd020ce2e7/95cbe853416f52d927dec41f1406dd75015ea131244a1ca875a7cd4ebe927ac8
12:memory:/kubepods/burstable/pod8833712d-6e69-4f5c-95f3-aebd020ce2e7/95cbe853416f52d927dec41f1406dd75015ea131244a1ca875a7cd4ebe927ac8
9:misc:/
7:rdma:/
0::/reserved.slice/containerd.service
# duckdb/duckdb#16608, cat /proc/self/cgroup in a pod with docker
== burstable v1 with rdma | 2b7a2f7fb725 - c101fead-5fa2-4525-97af-5894973b336e -
12:rdma:/
11:freezer:/kubepods/burstable/podc101fead-5fa2-4525-97af-5894973b336e/2b7a2f7fb72575bb50a46d68cceaf43a12a597184714cb33af2f6420f5314293
5:memory:/kubepods/burstable/podc101fead-5fa2-4525-97af-5894973b336e/2b7a2f7fb72575bb50a46d68cceaf43a12a597184714cb33af2f6420f5314293
# Qard/container-info test/fixtures/cgroup
== besteffort v1 | 34dc0b5e626f - 74c13223-5a00-11e9-b385-42010a80018d -
11:devices:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376
9:memory:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376
# coroot/coroot-node-agent cgroup/cgroup_test.go (TestContainerByCgroup), path only
== guaranteed v1 | 32c562ed81a2 - a38c12e8-255a-11e9-8cd9-0007cb0b2cc8 -
4:memory:/kubepods/poda38c12e8-255a-11e9-8cd9-0007cb0b2cc8/32c562ed81a2622b37b80cb216859820ba51bd694f60ee4cf10d07a4011266f8
# same test: kube-proxy makes a child cgroup inside its container; path only
== child of a container | 671a50f5d605 - 0d08203e-255a-11e9-8cd9-0007cb0b2cc8 -
4:memory:/kubepods/besteffort/pod0d08203e-255a-11e9-8cd9-0007cb0b2cc8/671a50f5d60566556912f61511d0ec9e4d5c78d53fbc4676727180438bbbbc55/kube-proxy
# same test: a static pod's UID is a 32-hex hash; path only
== static pod | d166c6190614 - 9729a196c4723b60ab401eaff722982d -
4:memory:/kubepods/burstable/pod9729a196c4723b60ab401eaff722982d/d166c6190614efc91956b78e96d74c3fbc96ca8e91948c36de3bc5b0e7b27d48
# same test: cri-o with the cgroupfs driver; path only
== cri-o cgroupfs | 63425c4a8b42 cri-o a48c12e8-255a-11e9-8cd9-0007cb0b2cc8 -
4:memory:/kubepods/poda48c12e8-255a-11e9-8cd9-0007cb0b2cc8/crio-63425c4a8b4291744a79dd9011fddc7a1f8ffda61f65d72196aa01d00cae2e2e
# elastic/apm-agent-python tests/utils/cgroup_tests.py: a container named by UUID
== uuid container | 15aa6e53-b09 - e9b90526-f47d-11e8-b2a5-080027b9f4fb -
1:name=systemd:/kubepods/besteffort/pode9b90526-f47d-11e8-b2a5-080027b9f4fb/15aa6e53-b09a-40c7-8558-c6c31e36c88a

# --- Kubernetes, systemd driver: the UID's dashes are underscores in the slice name ---
# coroot/coroot-node-agent cgroup/fixtures/proc/400/cgroup
== systemd v2 docker | 73051af27110 docker 8712f785-1a3e-41ec-a00b-e2dcc77431cb -
0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8712f785_1a3e_41ec_a00b_e2dcc77431cb.slice/docker-73051af271105c07e1f493b34856a77e665e3b0b4fc72f76c807dfbffeb881bd.scope
# lxc/lxc#3890, cat /proc/self/cgroup in a pod
== systemd v1 docker | d0b3604b67ac docker 7d4424e6-bb13-42f4-a47a-45a4828bf54d -
12:rdma:/
11:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d.slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope
10:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_45a4828bf54d.slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98.scope
# opencontainers/runc#4620, cat /proc/21689/cgroup
== systemd v1 cri-o | 5eed91756358 cri-o a5c1f8d5-1919-434d-add7-4afaafdaef89 -
13:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope
11:files:/
# coroot/coroot-node-agent cgroup/cgroup_test.go: crun's "container" child; path only
== cri-o crun child | 21572039dd83 cri-o ea19ff5d-943a-4466-a07e-a71e9e50cc62 -
0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podea19ff5d_943a_4466_a07e_a71e9e50cc62.slice/crio-21572039dd8398ff8272b031fa5422a40165145ab37f2f8794e1e7f844fe8118.scope/container
# opencontainers/runc#4620, systemctl status crio-conmon-...: the monitor, in the pod slice; path only
== cri-o conmon in the pod | - - 207aaad1-659f-4db8-88e0-46e0cdcc3004 -
0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod207aaad1_659f_4db8_88e0_46e0cdcc3004.slice/crio-conmon-32da98c8522068be05a7510a3eddb09cad6ed2f03286180d0e931d0d0b6224a6.scope
# openshift/microshift#697, systemd-cgls: conmon in system.slice is a host process; path only
== cri-o conmon on the host | - - - -
0::/system.slice/crio-conmon-e0c85fe7644a858988d9687c2e0736a7d31922740d0f3e001c6b2e0aa7e5f528.scope
# open-telemetry/opentelemetry-java#4507: containerd's "slice:prefix:id" left literally in a v1 tree
== containerd colon form | ee4b20e90ac7 containerd 0125ec2f-b64a-4868-8f5b-94b56cbab864 -
11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459
# containerd/nri#227, a kind node: the kubelet's cgroup root prefixes every slice with "kubelet-"; path only
== kind containerd | d7dfb4a21fe1 containerd 1e597579-417e-482f-bf65-5fe170c3aebd -
0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/cri-containerd-d7dfb4a21fe1703a8537e60d5af248af729315d187b24a538102d14874c8117d.scope
# kubernetes/minikube#11280, systemctl status kubepods.slice in a docker node: the pod wins over the node
# container; path assembled from that tree
== minikube cri-o in docker | 358607a37e7a cri-o 2ca4a155-3599-498d-bb9d-4446693fa3ea -
0::/docker/d6701ec289c56e4391acb11d07474b3139466857a305490575508a8b7a9fcf22/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2ca4a155_3599_498d_bb9d_4446693fa3ea.slice/crio-358607a37e7ada357032e7f5729c9ae6a3efdb7962acbcbe47ff6a3c5506cb1c.scope
# kontena/pharos-cluster#440, systemd-cgls: kube-proxy's child cgroup in a docker scope; path assembled
== systemd docker child | abddff03dfd7 docker 9692aa0e-748e-11e8-8dfa-76d458035df6 -
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9692aa0e_748e_11e8_8dfa_76d458035df6.slice/docker-abddff03dfd7710c79a750ce3e730365cbb2c8247a974170c1062683bc3e9152.scope/kube-proxy

# --- Docker, podman and ECS without Kubernetes ---
# ctrsploit/ctrsploit#280, cat /proc/1/cgroup: hybrid
== docker cgroupfs hybrid | 2403ccfe427f docker - -
12:net_cls,net_prio:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
10:rdma:/
8:memory:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
1:name=systemd:/docker/2403ccfe427f1dc7b6120dccb9ac58c2f8456950380d587a9f33ea7f00dd303d
0::/system.slice/containerd.service
# containerd/containerd#285, cat /proc/self/cgroup in docker: some hierarchies sit below init.scope
== docker systemd v1 | b33dda97580e docker - -
11:perf_event:/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
10:memory:/init.scope/system.slice/docker-b33dda97580e721a69fa81742190341f858ea809ec4a9d74a8cfd411b0ee7c26.scope
# coroot/coroot-node-agent cgroup/fixtures/proc/500/cgroup: seen from another cgroup namespace
== docker systemd v2 | ba7b10d15d16 docker - -
0::/../../../../system.slice/docker-ba7b10d15d16e10e3de7a2dcd408a3d971169ae303f46cfad4c5453c6326fee2.scope
# podman-container-tools/podman#10602: systemd in the container made an init.scope child
== podman v1 | 2521e906f0a0 podman - -
12:pids:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
11:memory:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope
1:name=systemd:/machine.slice/libpod-2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24.scope/init.scope
# podman-container-tools/podman#20423: crun's "container" child
== podman v2 | cf21d19260ac podman - -
0::/user.slice/user-0.slice/user@0.service/machine.slice/libpod-cf21d19260ace8544fe8b769fc2638bf2c0873dfbfff0b6253f0569b26a1d5eb.scope/container
# falcosecurity/libs#1613, systemd-cgls; path only
== podman conmon | - - - -
0::/machine.slice/libpod-conmon-a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4.scope
# Qard/container-info test/test.js: the ECS task UUID above the container is no container
== ecs | 7e9139716d9e - - -
3:cpuacct:/ecs/eb9d3d0c-8936-42d7-80d8-f82b2f1a629e/7e9139716d9e5d762d22f9f877b87d1be8b1449ac912c025a984750c5dbff157

# --- Slurm: job_<n> counts only below uid_<n> (v1) or *slurmstepd.scope (v2) ---
# NordicHPC/sonar src/linux/slurm_test.rs ("from a Fox compute node on 2025-03-13")
== slurm v2 | - - - 1392969
0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0
# same test ("from some older data")
== slurm v1 interactive | - - - 280678
10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0
# same test (eX3, Slurm 21): only freezer is in the job
== slurm v1 freezer only | - - - 748468
13:freezer:/slurm/uid_7319/job_748468/step_0
12:cpu,cpuacct:/system.slice/slurmd.service
11:hugetlb:/
2:memory:/system.slice/slurmd.service
1:name=systemd:/system.slice/slurmd.service
# SchedMD/slurm doc/html/cgroup_v2.shtml, systemctl status slurmstepd.scope (job_3385); paths only
== slurm v2 extern step | - - - 3385
0::/system.slice/slurmstepd.scope/job_3385/step_extern/user/task_0
== slurm v2 the stepd itself | - - - 3385
0::/system.slice/slurmstepd.scope/job_3385/step_0/slurm
# same doc: with --enable-multiple-slurmd the node name prefixes the scope; slurmd itself is no job
== slurm v2 multiple-slurmd daemon | - - - -
0::/system.slice/gamba1_slurmstepd.scope/slurmd
# treydock/cgroup_exporter collector/cgroupv2_test.go: the stepds' waiting area is no job
== slurm v2 system | - - - -
0::/system.slice/slurmstepd.scope/system
# template from plazonic/cgroup_exporter#5 and SchedMD/slurm#8 ("slurm_%n" with multiple slurmd)
== slurm v1 multiple-slurmd | - - - 55
4:memory:/slurm_node17/uid_1000/job_55/step_batch/task_0
# stackhpc/slurm-k8s-cluster#38: slurmd inside a pod; the scope itself is no job
== slurm in a pod | - - a101c1c8-1589-4313-acf5-02e3ca8d3994 -
0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poda101c1c8_1589_4313_acf5_02e3ca8d3994.slice/system.slice/slurmstepd.scope

# --- host processes and garbage ---
# Qard/container-info test/test.js: a login session
== user session | - - - -
12:devices:/user.slice
6:pids:/user.slice/user-1000.slice/session-2.scope
0::/user.slice/user-1000.slice/session-2.scope
# d2iq-archive/kubernetes-mesos#565, cat /proc/1/cgroup on the host
== host root | - - - -
12:name=systemd:/
4:memory:/
1:cpuset:/
# coroot/coroot-node-agent cgroup/fixtures/proc/100 (a service) and 3000 (inside LXC)
== services | - - - -
0::/system.slice/docker.service
0::/lxc.payload.first/system.slice/systemd-logind.service
# this test machine's own /proc/self/cgroup: 32 hex is no container id
== sandbox | - - - -
9:name=systemd:/
4:memory:/process_api/5eeea5c99c3836015a27f48cf90d3898
0::/
# NordicHPC/sonar src/linux/slurm_test.rs garbage, and a job_ without a Slurm parent
== garbage | - - - -
random garbage
/job_hello/
0::/job_12/step_0
"""


def _blocks() -> list[tuple[str, list[str], str]]:
    blocks: list[tuple[str, list[str], str]] = []
    for line in SAMPLES.splitlines():
        if line.startswith("== "):
            name, _, fields = line[3:].partition(" | ")
            blocks.append((name, fields.split(), ""))
        elif line and not line.startswith("#"):
            name, expected, text = blocks[-1]
            blocks[-1] = (name, expected, text + line + "\n")
    return blocks


BLOCKS = _blocks()


@pytest.mark.parametrize(("expected", "text"), [b[1:] for b in BLOCKS], ids=[b[0] for b in BLOCKS])
def test_real_samples(expected: list[str], text: str) -> None:
    container, runtime, pod, job = (None if e == "-" else e for e in expected)
    owner = parse_cgroup(text)
    if container is None:
        assert owner.container_id is None
    else:
        assert owner.container_id is not None and owner.container_id.startswith(container)
        assert owner.container_id in text and len(owner.container_id) in (36, 64)
    assert (owner.runtime, owner.pod_uid, owner.slurm_job_id) == (runtime, pod, job)


def test_the_table_is_big_enough() -> None:
    assert len(BLOCKS) >= 15 and all(len(b[1]) == 4 and b[2] for b in BLOCKS)


def test_line_order_does_not_matter() -> None:
    for _, _, text in BLOCKS:
        assert parse_cgroup("".join(reversed(text.splitlines(keepends=True)))) == parse_cgroup(text)


H64 = "0123456789abcdef" * 4


def test_a_path_alone() -> None:
    assert parse_path(f"/system.slice/docker-{H64}.scope") == CgroupOwner(H64, "docker")


def test_systemd_guaranteed_pod() -> None:
    # layout from CJLove/rt-operator notes/cgroupv1_notes.md (no QoS slice); no full sample found, ids ours
    text = f"0::/kubepods.slice/kubepods-pod0a1b2c3d_0000_4000_8000_00000000000a.slice/docker-{H64}.scope"
    assert parse_cgroup(text) == CgroupOwner(H64, "docker", "0a1b2c3d-0000-4000-8000-00000000000a")


@pytest.mark.parametrize(
    ("child", "expected"), [("ctr", CgroupOwner(H64, "podman")), ("conmon", CgroupOwner())]
)
def test_podman_cgroupfs_layout(child: str, expected: CgroupOwner) -> None:
    # layout described in podman-container-tools/podman#826: libpod_parent/libpod-<id>/{ctr,conmon}
    assert parse_cgroup(f"4:memory:/libpod_parent/libpod-{H64}/{child}\n") == expected


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", ":", "::", "0::", "0::relative/path", "a:b:c:d", "\x00\xff:::/", "0::/" + "/" * 10_000],
)
def test_garbage_gives_nobody(text: str) -> None:
    assert parse_cgroup(text) == CgroupOwner()


def test_never_raises_on_random_text() -> None:
    rng = random.Random(7)
    alphabet = "0123456789abcdef:/_-.\n kubepodslicescopejob_uid_crio-docker-"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(200)))
        assert isinstance(parse_cgroup(text), CgroupOwner)


def test_bytes_are_not_text() -> None:
    assert parse_cgroup(b"0::/docker/" + H64.encode()) == CgroupOwner()  # type: ignore[arg-type]
