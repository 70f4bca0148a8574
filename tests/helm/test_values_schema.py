"""values.schema.json: Helm refuses bad values before rendering anything, and names the offending key."""

from __future__ import annotations

import helm_python
import pytest

from tests.helm.chart import chart, chart_defaults, ci_values, render


@pytest.mark.parametrize("values", [None, "all-options-values.yaml", "external-redis-values.yaml"])
def test_good_values_pass(values: str | None) -> None:
    chart().validate_schema(ci_values(values) if values else chart_defaults())


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"gpuWorkers": {"replicas": -1}}, "/gpuWorkers/replicas"),
        ({"gpuWorkers": {"minReplicas": -1}}, "/gpuWorkers/minReplicas"),
        ({"gpuWorkers": {"maxReplicas": 0}}, "/gpuWorkers/maxReplicas"),
        ({"gpuWorkers": {"gpusPerPod": 0}}, "/gpuWorkers/gpusPerPod"),
        ({"gpuWorkers": {"replicas": "2"}}, "/gpuWorkers/replicas"),
        ({"gpuWorkers": {"groupName": "GPU_workers"}}, "/gpuWorkers/groupName"),
        ({"gpuWorkers": {"rayStartParams": {"num-gpus": "2"}}}, "num-gpus"),
        ({"head": {"rayStartParams": {"num-cpus": 0}}}, "/head/rayStartParams/num-cpus"),
        ({"head": {"resources": {"limits": {"cpu": "lots"}}}}, "/head/resources/limits/cpu"),
        ({"app": {"num_replicas": -1}}, "/app/num_replicas"),
        ({"app": {"dispatch_policy": "lifo"}}, "/app/dispatch_policy"),
        ({"app": {"autoscaling": {"min_replicas": 0}}}, "/app/autoscaling/min_replicas"),
        ({"app": {"engine": {"modle": "x"}}}, "additional properties 'modle' not allowed"),
        ({"app": {"engine": {"mode": "turbo"}}}, "/app/engine/mode"),
        ({"serve": {"port": 70000}}, "/serve/port"),
        ({"serve": {"proxyLocation": "Everywhere"}}, "/serve/proxyLocation"),
        ({"service": {"type": "ExternalName"}}, "/service/type"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"ray": {"version": "latest"}}, "/ray/version"),
        ({"redis": {"quotaDatabase": 16}}, "/redis/quotaDatabase"),
        ({"redis": {"auth": {"existingSecretPasswordKey": "bad key"}}}, "existingSecretPasswordKey"),
        ({"externalRedis": {"port": 0}}, "/externalRedis/port"),
        ({"ingress": {"hosts": [{"host": "a", "paths": [{"path": "v1", "pathType": "Prefix"}]}]}}, "path"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
        ({"tenancy": {"sla_classes": []}}, "/tenancy/sla_classes"),
        (
            {
                "tenancy": {
                    "sla_classes": [
                        {
                            "name": "Gold",
                            "priority_tier": 0,
                            "ttft_target_s": 1,
                            "tpot_target_s": 1,
                            "e2e_target_s": 1,
                        }
                    ]
                }
            },
            "name",
        ),
        ({"tenancy": {"fair_share": {"at_risk_margin_fraction": 2}}}, "at_risk_margin_fraction"),
        ({"autoscaler": {"upscalingMode": "Fast"}}, "/autoscaler/upscalingMode"),
        ({"fullnameOverride": "x" * 41}, "/fullnameOverride"),
    ],
)
def test_bad_values_are_rejected(values: dict, where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as excinfo:
        render(values)
    assert where in str(excinfo.value)
