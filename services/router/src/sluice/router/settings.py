from pydantic import Field

from sluice.config import SluiceSettings


class RouterSettings(SluiceSettings):
    models_file: str | None = Field(
        None,
        description="JSON model catalog (aliases, versions, rollout weights); unset = the single "
        "SLUICE_MODEL_NAME/VERSION/DIR model",
    )
    placement_timeout_s: float = Field(30.0, gt=0, description="how long a request may wait for a placement")
