# verl's older SFT entry point (examples/sft/gsm8k style): single-turn rows read from a dict column, LoRA,
# sequence parallelism and the padding-free switch; paths and sizes rewritten for a 2-core CPU and a tiny model.
set -x

nproc_per_node=$1
save_path=$2
shift 2

torchrun --standalone --nnodes=1 --nproc_per_node=$nproc_per_node \
     -m verl.trainer.fsdp_sft_trainer \
    data.train_files=$DATA_DIR/train.parquet \
    data.val_files=$DATA_DIR/test.parquet \
    data.prompt_key=extra_info \
    data.response_key=extra_info \
    data.prompt_dict_keys=['question'] \
    +data.response_dict_keys=['answer'] \
    data.train_batch_size=8 \
    data.micro_batch_size=4 \
    optim.lr=1e-4 \
    model.partial_pretrain=$MODEL_PATH \
    model.lora_rank=8 \
    model.lora_alpha=16 \
    model.target_modules=all-linear \
    model.strategy=fsdp \
    trainer.default_local_dir=$save_path \
    trainer.project_name=gsm8k-sft \
    trainer.experiment_name=tiny-sft \
    trainer.logger=console \
    trainer.total_epochs=1 $@ \
    ulysses_sequence_parallel_size=2 \
    use_remove_padding=true
