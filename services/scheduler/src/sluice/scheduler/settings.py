from pydantic import Field

from sluice.config import SluiceSettings


class SchedulerSettings(SluiceSettings):
    replica_addresses: str = Field(
        "127.0.0.1:50061",
        description="comma-separated host:port of every replica to watch (SLUICE_REPLICA_ADDRESSES)",
    )

    def replica_address_list(self) -> list[str]:
        return [a.strip() for a in self.replica_addresses.split(",") if a.strip()]
