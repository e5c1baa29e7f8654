"""Prefix-cache scopes: tenants apart by default, together where a platform
groups them or shares the cache."""

from sluice.engine.block_hash import root_block_hash
from sluice.router.cache_scope import CacheScope


def test_every_tenant_has_its_own_scope_by_default():
    scope = CacheScope()
    assert scope.salt_for("a") != scope.salt_for("b")
    assert root_block_hash(scope.salt_for("a")) != root_block_hash(scope.salt_for("b"))


def test_grouped_tenants_share_and_a_tenant_named_like_the_group_does_not():
    scope = CacheScope(groups={"team-a": "acme", "team-b": "acme"})
    assert scope.salt_for("team-a") == scope.salt_for("team-b")
    assert scope.salt_for("acme") != scope.salt_for("team-a")
    assert scope.salt_for("other") not in {scope.salt_for("team-a"), scope.salt_for("acme")}


def test_a_shared_cache_is_the_unsalted_root():
    scope = CacheScope(shared=True)
    assert scope.salt_for("a") == scope.salt_for("b") == ""
    assert root_block_hash("") == root_block_hash(scope.salt_for("a"))
