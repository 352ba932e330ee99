"""Snapshots of both synthesized templates, with asset hashes masked.

A snapshot shows every change to the deployed resources in review, including the ones no
fine-grained test looks at. Asset hashes (the Lambda bundle's S3 key, the worker image's tag, the
bootstrap's asset names) change with every edit of the runtime code, so they are masked: a change
of runtime code alone leaves the snapshots as they are.

Update after an intended change with
``pytest tests/infra/test_infra_snapshot.py --snapshot-update``.
"""

from __future__ import annotations

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.app_support import ASSET_HASH, MASK, default_app, mask_asset_hashes


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("role", ["primary", "secondary"])
def test_template_matches_snapshot(role, snapshot_json):
    built = default_app()
    template = built.template(getattr(built, role)).to_json()
    assert mask_asset_hashes(template) == snapshot_json


def test_masked_templates_hold_no_asset_hash():
    built = default_app()
    for stack in (built.primary, built.secondary):
        text = str(mask_asset_hashes(built.template(stack).to_json()))
        assert not ASSET_HASH.search(text)
        assert MASK in text  # the Lambda bundle and the image are there, masked


def test_mask_replaces_asset_hashes_only():
    digest = "0123456789abcdef" * 4
    template = {
        "S3Key": f"{digest}.zip",
        "Image": {"Fn::Sub": f"123456789012.dkr.ecr.us-east-1.${{AWS::URLSuffix}}/repo:{digest}"},
        f"asset.{digest}": ["keep-me", 42, None],
        "Deployment": "IngestionApiDeployment7774FCCC1d0af1ffad9cf5a00812baf7",  # 32 hex: kept
        "Longer": "f" * 65,
    }
    assert mask_asset_hashes(template) == {
        "S3Key": f"{MASK}.zip",
        "Image": {"Fn::Sub": f"123456789012.dkr.ecr.us-east-1.${{AWS::URLSuffix}}/repo:{MASK}"},
        f"asset.{MASK}": ["keep-me", 42, None],
        "Deployment": "IngestionApiDeployment7774FCCC1d0af1ffad9cf5a00812baf7",
        "Longer": "f" * 65,
    }
