"""`topkgen.explain`, as earlier releases imported it: the explanation lives in the policy stage."""

from topkgen.policy.explain import Explanation, explain

__all__ = ["Explanation", "explain"]
