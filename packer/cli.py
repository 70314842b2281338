import click

from packer.pilinfo import describe


@click.group()
def main() -> None:
    """shardship packer."""


@main.command()
@click.option("--pil", is_flag=True)
def check(pil: bool) -> None:
    click.echo(f"PIL: {describe()}")
